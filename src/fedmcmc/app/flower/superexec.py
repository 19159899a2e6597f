"""Flower's SuperExec with ClientApp processes forked from a warm parent.

A SuperNode (flwr 1.41, which the package pins) starts ``flower-superexec``, which starts a new
``flwr-clientapp`` process for every message: each one starts Python and imports Flower
(about 1.6 s of CPU on a 2-core machine) before it pulls its message, so on a machine whose
nodes share a few cores that import is most of a round. :func:`main` is ``flower-superexec``
(same arguments, same loop, same plugin) whose executor hands each ClientApp task to a
**zygote**: a process that has imported Flower's ClientApp runtime and fedmcmc's ClientApp
module once (no JAX, no threads) and forks a child per task. The child runs Flower's own
``run_clientapp`` with the task's token, exactly as ``flwr-clientapp --token ...`` would, and
exits, so every message still gets a fresh process with nothing of an earlier message in it;
only the imports are shared, copy-on-write. Tasks of other types, and every task if the
zygote has died, go to Flower's subprocess executor.

``fedmcmc supernode`` starts its SuperExec so (:mod:`fedmcmc.app.flower.supernode`); a site that
wants Flower's own launcher runs ``flower-supernode`` instead.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

_ZYGOTE = "from fedmcmc.app.flower.superexec import zygote; zygote()"


class ForkExecutor:
    """Flower's executor contract (``flwr.supercore.superexec.executor.types.Executor``): ClientApp
    tasks are forked by the zygote, any other task (or any task once the zygote is gone) is
    started by Flower's ``SubprocessExecutor``."""

    def __init__(self):
        from flwr.supercore.superexec.executor import SubprocessExecutor

        self.fallback = SubprocessExecutor()
        self.zygote = subprocess.Popen([sys.executable, "-c", _ZYGOTE], stdin=subprocess.PIPE, text=True)

    def get_eligible_capacity(self, supported_task_types, **kwargs):
        return self.fallback.get_eligible_capacity(supported_task_types, **kwargs)

    def wait_for_capacity(self, task_type=None, **kwargs):
        return self.fallback.wait_for_capacity(task_type, **kwargs)

    def launch(self, spec):
        from flwr.supercore.constant import TaskType
        from flwr.supercore.superexec.executor import LaunchResult

        if spec.task_type == TaskType.CLIENT_APP and self.zygote.poll() is None:
            task = {"runtime_api_address": spec.runtime_api_address, "token": spec.token,
                    "insecure": spec.insecure, "root_certificates_path": spec.root_certificates_path,
                    "parent_pid": spec.parent_pid, "runtime_dependency_install": spec.runtime_dependency_install,
                    "suppress_output": spec.suppress_output}
            try:
                self.zygote.stdin.write(json.dumps(task) + "\n")
                self.zygote.stdin.flush()
                return LaunchResult.accepted()
            except OSError:
                pass
        return self.fallback.launch(spec)

    def close(self):
        if self.zygote.poll() is None:
            self.zygote.stdin.close()
        self.fallback.close()

    def reconcile(self):
        self.fallback.reconcile()


def _child(task: dict) -> int:
    """Run one ClientApp task as ``flwr-clientapp`` would; its exit code."""
    from flwr.supercore.tls import validate_and_resolve_root_certificates
    from flwr.supernode.runtime.run_clientapp import run_clientapp

    from fedmcmc.app.flower.supernode import quick_pulls

    quick_pulls()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    if task["suppress_output"]:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    sys.argv = ["flwr-clientapp"]
    try:
        run_clientapp(runtime_api_address=task["runtime_api_address"], token=task["token"],
                      insecure=task["insecure"],
                      certificates=validate_and_resolve_root_certificates(task["root_certificates_path"],
                                                                          task["insecure"]),
                      parent_pid=task["parent_pid"], runtime_dependency_install=task["runtime_dependency_install"])
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else 1
    return 0


def zygote() -> None:
    """Import the ClientApp runtime, then fork one child per task line on stdin until EOF."""
    import flwr.supercore.tls  # noqa: F401
    import flwr.supernode.runtime.run_clientapp  # noqa: F401

    import httpcore  # noqa: F401  (httpx imports its transport on first use)

    import fedmcmc.app.flower.apps  # noqa: F401

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for line in sys.stdin:
        task = json.loads(line)
        if os.fork() == 0:
            code = 1
            try:
                code = _child(task)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Run ``flower-superexec`` with ``argv`` (default: the command line) and the fork executor."""
    from flwr.supercore.cli.flower_superexec import flower_superexec
    from flwr.supercore.constant import ExecutorType
    from flwr.supercore.superexec import run_superexec

    flower_executor = run_superexec.get_executor

    def get_executor(executor_type, executor_config=None, **kwargs):
        if executor_type == ExecutorType.SUBPROCESS:
            return ForkExecutor()
        return flower_executor(executor_type, executor_config, **kwargs)

    run_superexec.get_executor = get_executor
    sys.argv = ["flower-superexec", *(sys.argv[1:] if argv is None else argv)]
    flower_superexec()


if __name__ == "__main__":
    main()
