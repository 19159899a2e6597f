"""docs/tutorial.md runs as written: every ``$ `` command of its console blocks, in order, in
one fresh folder, each exiting 0; then what the tutorial says of the outputs is checked."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedmcmc.app import config

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}


def commands() -> list[str]:
    blocks = re.findall(r"```console\n(.*?)```", TUTORIAL.read_text(), re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess:
    argv = shlex.split(command)
    # the commands a user types: `fedmcmc` and `python` of the environment the tests run in
    argv = {"fedmcmc": [sys.executable, "-m", "fedmcmc"], "python": [sys.executable]}.get(argv[0], argv[:1]) + argv[1:]
    return subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=900)


#: The deployment the tutorial documents, and the first rounds of it that the test runs.
FULL = {"num_chains": 64, "num_iterations": 1536, "burn_in": 256}
SHORT = {"num_iterations": 4, "burn_in": 0, "chunk_size": 2}


def shorten(path: Path) -> None:
    """Check that the example writes the documented run (the tutorial says so in words), then keep
    its first rounds: every other setting, the federation's rounds included, is the full run's."""
    text = path.read_text()
    run = tomllib.loads(text)["run"]
    assert {k: run[k] for k in FULL} == FULL
    prose = " ".join(TUTORIAL.read_text().split())
    assert f"{FULL['num_chains']} chains of {FULL['num_iterations']:,} rounds" in prose
    for key, value in SHORT.items():
        text = re.sub(rf"(?m)^{key} = \d+", f"{key} = {value}", text)
    path.write_text(text)


def test_tutorial_commands_run_as_written(tmp_path):
    steps = commands()
    assert 4 <= len(steps) <= 10, "the tutorial promises at most ten commands"
    for command in steps:
        if command.startswith("fedmcmc flower deploy"):
            shorten(tmp_path / "hospitals" / "hospitals-flower.toml")
        proc = run(command, tmp_path)
        assert proc.returncode == 0, f"{command}\n{proc.stdout}\n{proc.stderr}"
        if command.startswith("fedmcmc flower deploy"):  # its progress, its estimate and run's warnings
            assert "rounds take about" in proc.stderr and "round 4/4," in proc.stderr, proc.stderr
            assert "fedmcmc: warning: R-hat > " in proc.stderr, proc.stderr
    summary = json.loads((tmp_path / "runs/sim/summary.json").read_text())
    assert summary["warnings"] == []  # R-hat <= 1.01 and bulk ESS >= 400 for every parameter
    assert len(summary["predictive"]["clients"]) == 3 and summary["predictive"]["overall"]["accuracy"] > 0.9
    new = pd.read_csv(tmp_path / "runs/sim/new_patients.csv")
    assert len(new) == 40 and list(new.columns[:2]) == ["p_benign", "p_malignant"] and new["correct"].mean() > 0.85
    np.testing.assert_allclose(new.filter(regex="^p_").sum(axis=1), 1.0, rtol=1e-5)
    # over Flower: the nodes read their own files; the same samples as the simulator (printed True)
    assert proc.stdout.strip() == "same samples: True", proc.stdout
    flower = json.loads((tmp_path / "runs/flower/results.json").read_text())
    assert flower["flower"]["engine"] == "deployment" and flower["flower"]["missing_replies"] == 0
    # the deployment chose its step, whitening and starts from its own rounds: the simulator's "auto"
    cfg = tomllib.loads((tmp_path / "hospitals/hospitals-flower.toml").read_text())
    assert cfg["sampler"]["step_size"] == "auto" and "init" not in cfg["run"]
    assert flower["step"]["value"] == config.build(cfg, tmp_path / "hospitals").step["value"]
    assert flower["whitening"]["used"] is True and flower["flower"]["ask_rounds"] > 0
    # the held-out rows stayed on the nodes; their metrics are the simulator's (one evaluate round)
    held = [json.loads((tmp_path / f"runs/{r}/summary.json").read_text())["predictive"] for r in ("flower", "sim-flower")]
    assert held[0] == held[1] and len(held[0]["clients"]) == 3 and flower["flower"]["evaluate"]["rounds"] == 1
