"""step_size = "auto" in a run config: the record, the printed line, the refusals, and the issue's
acceptance test on the breast-cancer split."""

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from fedmcmc.app import config

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}

CONFIG = """
[problem]
name = "heterogeneous-gaussian"
num_clients = 4
dim = 3

[sampler]
name = "{sampler}"
step_size = "auto"
{extra}

[run]
seed = 1
num_chains = 2
num_iterations = 400
"""


def test_run_prints_and_records_the_chosen_step(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(sampler="qlsd*", extra="compression = { bits = 4 }"))
    proc = subprocess.run([sys.executable, "-m", "fedmcmc", "run", path, "--out", tmp_path / "out", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    step = json.loads((tmp_path / "out" / "results.json").read_text())["step"]
    assert set(step) >= {"value", "rule", "lambda_max", "rounds", "bits"} and "Thm S6" in step["rule"]
    assert f"step_size = auto: {step['value']:.4g}" in proc.stdout
    # QLSD* needs the mode anyway (counted as theta_star): the step costs its power iterations only
    assert step["bits"] == step["rounds"] * 2 * 4 * 32 * 3


@pytest.mark.parametrize("sampler, extra", [("fedavg", "local_steps = 2"),
                                            ("dg-sgld", "rho = [0.1, 0.1, 0.01, 0.01]"),
                                            ("fa-hmc", 'num_leapfrog = 3\nlocal_steps = 2\nclock = "leapfrog"')])
def test_every_kind_of_step_is_set(sampler, extra):
    built = config.build(tomllib.loads(CONFIG.format(sampler=sampler, extra=extra)))
    assert built["step"]["rule"] != "given" and np.all(np.asarray(built["step"]["value"]) > 0)
    given = config.build(tomllib.loads(CONFIG.format(sampler=sampler, extra=extra).replace('"auto"', "0.001")))
    assert given["step"] == {"value": 0.001, "rule": "given"}


def test_psgld_auto_is_one_clear_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(sampler="psgld", extra=""))
    proc = subprocess.run([sys.executable, "-m", "fedmcmc", "run", path, "--out", tmp_path / "out"],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("fedmcmc: error: psgld has no step_size = \"auto\"")
    assert not (tmp_path / "out").exists()
