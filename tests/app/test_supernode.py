"""``fedmcmc supernode``: Flower's SuperNode with its idle sleeps capped (the deployments of the
Flower tests run their SuperNodes so)."""

import time

import pytest

from fedmcmc.app.flower import supernode


def test_the_idle_sleeps_are_capped_and_nothing_else_changes():
    clock = supernode._Clock(0.05)
    started = time.monotonic()
    clock.sleep(3)  # the SuperNode's idle sleep
    assert time.monotonic() - started < 1.0
    assert clock.monotonic is time.monotonic and clock.time is time.time


@pytest.mark.parametrize("argv, message", [(["--idle-poll"], "needs a number"), (["--idle-poll", "x"], "needs a number"),
                                           (["--idle-poll", "0"], r"must lie in \(0, 3\]")])
def test_a_bad_poll_is_refused_in_one_line(argv, message, capsys):
    assert supernode.main(argv) == 2
    assert __import__("re").search(message, capsys.readouterr().err)


def test_the_supernode_starts_fedmcmc_superexec_with_flowers_arguments():
    import subprocess
    import sys

    proc = supernode._Launcher().Popen(["flower-superexec", "--help"], stdout=subprocess.PIPE, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.args[:3] == [sys.executable, "-m", "fedmcmc.app.flower.superexec"] and proc.returncode == 0
    assert "--runtime-api-address" in out
    assert supernode._Launcher().run is subprocess.run  # anything else is subprocess's


def test_quick_pulls_start_flowers_object_retries_sooner():
    from flwr.supercore.inflatable import inflatable_utils

    pulls = (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree)
    before = [p.__kwdefaults__["initial_backoff"] for p in pulls]
    try:
        supernode.quick_pulls(0.05)
        assert [p.__kwdefaults__["initial_backoff"] for p in pulls] == [0.05, 0.05]
    finally:
        for p, b in zip(pulls, before):
            p.__kwdefaults__["initial_backoff"] = b


def test_clientapp_tasks_go_to_the_zygote_and_the_rest_or_all_once_it_is_gone_to_flowers_launcher():
    from flwr.supercore.constant import TaskType
    from flwr.supercore.superexec.executor import ExecutionSpec

    from fedmcmc.app.flower import superexec

    executor = superexec.ForkExecutor()
    launched = []
    executor.fallback.launch = lambda spec: launched.append(spec.task_type)
    sent = []
    executor.zygote.kill()
    executor.zygote.wait()

    class Zygote:  # records the task lines the executor writes
        stdin = type("Pipe", (), {"write": lambda self, line: sent.append(line), "flush": lambda self: None})()

        def poll(self):
            return None

    spec = dict(runtime_api_address="127.0.0.1:1", token="t", insecure=True, root_certificates_path=None,
                runtime_dependency_install=False, parent_pid=None, suppress_output=True, task_id=1)
    dead = executor.zygote
    executor.zygote = Zygote()
    executor.launch(ExecutionSpec(task_type=TaskType.CLIENT_APP, **spec))
    executor.launch(ExecutionSpec(task_type=TaskType.SERVER_APP, **spec))
    assert len(sent) == 1 and '"token": "t"' in sent[0] and launched == [TaskType.SERVER_APP]
    executor.zygote = dead
    executor.launch(ExecutionSpec(task_type=TaskType.CLIENT_APP, **spec))
    assert launched == [TaskType.SERVER_APP, TaskType.CLIENT_APP] and len(sent) == 1
