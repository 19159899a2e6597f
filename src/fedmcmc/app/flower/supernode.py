"""Flower's SuperNode with shorter waits: ``fedmcmc supernode [--idle-poll S] ARGS...``.

``flower-supernode`` (flwr 1.41, which the package pins) sleeps 3 s whenever it asks the SuperLink
for a message and finds none, and 0.5 s between its checks for the ClientApp's reply. A sampler's
round is a message to every node that arrives while the nodes are asleep, so every round costs
those seconds, however little the nodes compute. This entry point runs the same SuperNode (every
``ARGS`` is ``flower-supernode``'s) with three changes, each a wait of Flower's and none a
change of what is computed or sent:

* those sleeps capped at ``--idle-poll`` seconds (default :data:`IDLE_POLL`): a node then asks the
  SuperLink for work every ``S`` seconds while idle, one small request each;
* its SuperExec is :mod:`fedmcmc.app.flower.superexec`, whose ClientApp processes are forked from
  a warm parent instead of starting Python and importing Flower each;
* a missing object (the SuperNode records a message before its objects have arrived) is asked
  again after ``S`` seconds, not Flower's 1 s (:func:`quick_pulls`).

:class:`~fedmcmc.app.flower.launch.LocalDeployment` starts its SuperNodes so; a site starts its own
the same way (docs/flower.md, "Latency per round").
"""

from __future__ import annotations

import subprocess
import sys
import time

#: Seconds a SuperNode waits between its checks for work when idle.
IDLE_POLL = 0.2


class _Launcher:
    """``subprocess`` whose ``Popen`` starts :mod:`fedmcmc.app.flower.superexec` for
    ``flower-superexec`` (same arguments)."""

    def Popen(self, command, *args, **kwargs):  # noqa: N802 (subprocess's name)
        if command and command[0] == "flower-superexec":
            command = [sys.executable, "-m", "fedmcmc.app.flower.superexec", *command[1:]]
        return subprocess.Popen(command, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(subprocess, name)


class _Clock:
    """``time`` with ``sleep`` capped at ``poll`` seconds."""

    def __init__(self, poll: float):
        self.poll = poll

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.poll))

    def __getattr__(self, name):
        return getattr(time, name)


def quick_pulls(backoff: float = IDLE_POLL) -> None:
    """Start Flower's retries of an object not yet available (this process) at ``backoff``
    seconds instead of 1 s (then doubling, capped at Flower's 10 s, as before)."""
    from flwr.supercore.inflatable import inflatable_utils

    for pull in (inflatable_utils.pull_objects, inflatable_utils.pull_and_inflate_object_from_tree):
        pull.__kwdefaults__["initial_backoff"] = backoff


def main(argv: list[str] | None = None) -> int:
    """Run ``flower-supernode`` with ``argv`` (default: the command line), less ``--idle-poll S``."""
    args = list(sys.argv[1:] if argv is None else argv)
    poll = IDLE_POLL
    if "--idle-poll" in args:
        at = args.index("--idle-poll")
        try:
            poll = float(args[at + 1])
        except (IndexError, ValueError):
            sys.stderr.write("fedmcmc supernode: --idle-poll needs a number of seconds, e.g. --idle-poll 0.2\n")
            return 2
        if not 0 < poll <= 3:
            sys.stderr.write(f"fedmcmc supernode: --idle-poll must lie in (0, 3] seconds (got {poll:g})\n")
            return 2
        del args[at:at + 2]
    from flwr.supernode import start_client_internal
    from flwr.supernode.cli import flower_supernode

    start_client_internal.time = _Clock(poll)
    start_client_internal.subprocess = _Launcher()
    quick_pulls(poll)
    sys.argv = ["flower-supernode", *args]
    return flower_supernode()


if __name__ == "__main__":
    sys.exit(main())
