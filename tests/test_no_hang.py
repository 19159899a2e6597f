"""A run never hangs: the default paths, watched from outside one long-lived process."""

import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).parent
STEP_TIMEOUT = 120  # seconds without progress that count as a hang (a step compiles in about 3 s)


def test_nothing_hangs_in_one_long_lived_process():
    """find_mode, NUTS, then every sampler and surrogate kind in this process and in worker
    processes (``long_lived.py``), in ONE process watched from outside: a step without progress
    for STEP_TIMEOUT seconds fails, naming it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(HERE / "long_lived.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    current, log = "start-up", []
    try:
        while True:
            try:
                line = lines.get(timeout=STEP_TIMEOUT)
            except queue.Empty:
                pytest.fail(f"{current}: no progress in {STEP_TIMEOUT} s, the run hangs\n" + "".join(log[-20:]))
            if line is None:
                break
            log.append(line)
            if line.startswith("START "):
                current = line[6:].strip()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
        proc.wait()
    assert proc.returncode == 0 and log[-1].strip() == "ALL DONE", "".join(log[-30:])


