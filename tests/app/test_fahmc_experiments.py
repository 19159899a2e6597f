"""The FA-HMC reproductions run by name, with tiny settings, and write what the docs quote."""

import json
import subprocess
import sys

import numpy as np
import pytest

from test_cli import ENV, ROOT, assert_one_line_error, fedmcmc, refused


def reproduce(tmp_path, name, *sets):
    env = {**ENV, "FEDMCMC_CACHE": str(tmp_path / "cache")}
    args = ["reproduce", name, "--quick", "--out", tmp_path / name, "--no-progress"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run([sys.executable, "-m", "fedmcmc", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / name / "results.json").read_text())


# a tiny logistic problem, in process: d = 3, 40 points on 4 clients
TINY = dict(dim=3, num_points=40, num_clients=4)


def stand_in_reference(cfg, model, data):
    """Gaussian draws in place of the NUTS reference (whose compilation alone takes longer than these
    smoke tests may; the reference itself is tested in test_metrics_reference.py)."""
    from fedmcmc.evaluation.reference import ReferenceSamples

    draws = 0.5 * np.random.default_rng(0).standard_normal((2, 300, model.dim))
    return ReferenceSamples(draws, 1.0, 600.0, 0, np.ones(2), 0.0, True)


@pytest.mark.slow
def test_fahmc_vs_fald(tmp_path, monkeypatch):
    from fedmcmc.app.studies import fahmc_vs_fald, fahmc_vs_fald_d10
    from fedmcmc.app.studies.runner import run_study

    monkeypatch.setattr(fahmc_vs_fald, "logistic_reference", stand_in_reference)
    # the paper's K = floor(pi / (3 eta)) below eta = 0.01 (K = 104 at 0.01, spanning rounds of T = 10), tuned above
    assert fahmc_vs_fald.leapfrog_grid(0.01, [3, 10]) == [104]
    assert fahmc_vs_fald.leapfrog_grid(0.05, [1, 3, 10, 50]) == [3, 10, 20]
    # Fig. 1(d) is the same study at d = 10 with noisy gradients only
    d10 = fahmc_vs_fald_d10.FULL
    assert d10["dim"] == 10 and d10["gradients"] == ["noisy"] and fahmc_vs_fald.FULL["dim"] == 1000
    assert fahmc_vs_fald_d10.science is fahmc_vs_fald.science
    tiny = dict(TINY, gradients=["noisy"], step_sizes=[0.2], tuned_k=[], rounds=30, burn_in=10, num_chains=4,
                chain_groups=2)
    r = run_study(fahmc_vs_fald, tmp_path / "out", progress=False, settings=tiny)
    runs = {(x["method"], x["num_leapfrog"]) for x in r["runs"]}
    assert runs == {("FA-LD", 1), ("FA-HMC", 5)}
    for x in r["runs"]:
        # the group mean is over groups half the pool's size: finite samples raise ME
        assert np.isclose(np.mean(x["me_groups"]), x["me"]) and x["me_se"] > 0 and x["me"] > x["me_pooled"] > 0
    assert r["me_floor"]["group"] > r["me_floor"]["pooled"] > 0  # fewer draws, higher floor
    gain = r["summary"]["noisy"]["gain_by_step_size"]["0.2"]
    assert np.isclose(gain["difference"], r["by_step_size"]["noisy"]["FA-LD"]["0.2"]["me"]
                      - r["by_step_size"]["noisy"]["FA-HMC"]["0.2"]["me"])
    assert (tmp_path / "out" / "me_vs_step_size.png").stat().st_size > 0


@pytest.mark.slow
def test_fahmc_local_steps(tmp_path, monkeypatch):
    from fedmcmc.app.studies import fahmc_local_steps, fahmc_vs_fald
    from fedmcmc.app.studies.runner import run_study

    # one cached NUTS reference (keyed by data and settings) serves both d = 1000 studies
    assert all(fahmc_local_steps.FULL[k] == fahmc_vs_fald.FULL[k] for k in fahmc_local_steps._PROBLEM)
    monkeypatch.setattr(fahmc_local_steps, "logistic_reference", stand_in_reference)
    settings = dict(TINY, local_steps=[4], leapfrog_budget=40, min_rounds=1, max_rounds=30, num_leapfrog=6,
                    step_size=0.1, eps=[0.6, 0.3, 0.05], curve_points=8, gaussian_local_steps=[1, 10, 200],
                    gaussian_rounds=1500)
    # every T gets the same leapfrog budget (40 steps here), within [min_rounds, max_rounds]
    assert [fahmc_local_steps.rounds_for(t, dict(settings, sample_every=1)) for t in (1, 4, 70)] == [30, 10, 1]
    assert fahmc_local_steps.rounds_for(70, dict(settings, sample_every=1, min_rounds=5)) == 5
    r = run_study(fahmc_local_steps, tmp_path / "out", quick=True, progress=False, settings=settings)
    v = r["local_steps"]["4"]
    reach = [v["rounds_to_reach"][str(e)] for e in settings["eps"]]
    assert reach == sorted(reach) and np.isfinite(reach[0])  # a smaller eps is never reached earlier
    assert np.all(np.diff(v["curve"]["rounds"]) > 0) and v["curve"]["rounds"][-1] == v["rounds"] == 10
    assert v["curve"]["me"][-1] == v["final_me"] < v["curve"]["me"][0]  # the online ME falls as samples come
    g = r["gaussian_exact"]
    # the exact U-curve: more local steps save rounds until client drift puts the floor above eps
    assert g["10"]["rounds_to_eps"] < g["1"]["rounds_to_eps"]
    assert g["200"]["rounds_to_eps"] == float("inf") and g["200"]["stationary_w2_squared"] > 0.1


def test_list_settings_are_checked():
    assert_one_line_error(refused("reproduce", "fahmc-vs-fald", "--set", "step_sizes=0.1,x"), "step_sizes",
                          "separated by commas")
    assert_one_line_error(refused("reproduce", "fahmc-local-steps", "--set", "local_steps=1,2.5"), "integer")


@pytest.mark.slow
def test_fa_hmc_run_config(tmp_path):
    out = tmp_path / "o"
    proc = fedmcmc("run", ROOT / "examples" / "fa_hmc.toml", "--out", out, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    r = json.loads((out / "results.json").read_text())
    assert r["sampler"] == "fa-hmc"
    # de-biased FA-HMC on the Section 5.2 Gaussian: the exact law's stationary variance is 1.6 (1 + O(eta^2))
    assert 0.9 < r["posterior_variance_ratio"] < 1.1
    assert r["bits_per_iteration"] == 10 * 2 * 32 * 10  # 10 clients upload the change and the anchor


def test_fa_hmc_config_errors(tmp_path):
    base = (ROOT / "examples" / "fa_hmc.toml").read_text()
    cases = [
        (base.replace("num_leapfrog = 5", "#"), "needs num_leapfrog"),
        (base.replace('name = "fa-hmc"', 'name = "fa-ld"'),
         "fa-ld does not take ['clock', 'num_leapfrog'] (settings of fa-hmc)"),
        (base.replace('name = "fa-hmc"', 'name = "qlsd#"'), "(settings of fa-hmc)"),
        (base.replace("debiased = true", "debiased = 1"), "debiased must be true or false"),
        (base.replace("correlation = 1.0", "correlation = 2.0"), "correlation rho must lie in [0, 1]"),
        (base.replace("dim = 10", "dim = 10\nmin_size = 3"), "unknown key(s) ['min_size']"),
        (base.replace('clock = "leapfrog"', "#"), "needs clock"),
        (base.replace('clock = "leapfrog"', 'clock = "round"'), "unknown clock 'round'"),
        (base.replace('clock = "leapfrog"', 'clock = "leapfrog"\nmomentum_sync = "reset"'),
         "unknown momentum_sync 'reset'"),
        (base.replace('name = "fa-hmc"', 'name = "dsgld"'), "'clock'"),
    ]
    for i, (text, fragment) in enumerate(cases):
        path = tmp_path / f"c{i}.toml"
        path.write_text(text)
        assert_one_line_error(refused("run", path, "--out", tmp_path / f"o{i}", "--no-progress"), fragment)
