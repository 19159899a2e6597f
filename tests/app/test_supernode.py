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
