"""The FA-HMC reproductions run by name, with tiny settings, and write what the docs quote."""

import json
import subprocess
import sys

import numpy as np

from test_cli import ENV, ROOT, assert_one_line_error, fedmcmc


def reproduce(tmp_path, name, *sets):
    env = {**ENV, "FEDMCMC_CACHE": str(tmp_path / "cache")}
    args = ["reproduce", name, "--quick", "--out", tmp_path / name, "--no-progress"]
    for s in sets:
        args += ["--set", s]
    proc = subprocess.run([sys.executable, "-m", "fedmcmc.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / name / "results.json").read_text())


REFERENCE = ("reference_samples=400", "reference_warmup=300", "reference_chains=2")


def test_fahmc_vs_fald(tmp_path):
    r = reproduce(tmp_path, "fahmc-vs-fald", "step_sizes=0.1,0.3", "tuned_k=3", "rounds=30", "burn_in=10",
                  "num_chains=4", *REFERENCE)
    for setting in ("exact", "noisy"):
        for method in ("FA-HMC", "FA-LD", "De-biased FA-HMC", "Centralised uHMC"):
            assert 0 < r["best_me"][setting][method] < 5
    assert {x["num_leapfrog"] for x in r["runs"] if x["method"] == "FA-LD"} == {1}
    assert (tmp_path / "fahmc-vs-fald" / "me_vs_step_size.png").stat().st_size > 0
    assert (tmp_path / "fahmc-vs-fald" / "posterior.nc").exists()
    assert {x["setting"] for x in r["runs"]} == {"exact", "noisy"}


def test_fahmc_local_steps(tmp_path):
    r = reproduce(tmp_path, "fahmc-local-steps", "local_steps=1,3", "rounds=12", "num_chains=4",
                  "gaussian_local_steps=1,10,200", "gaussian_rounds=1500", *REFERENCE)
    assert set(r["local_steps"]) == {"1", "3"}
    g = r["gaussian_exact"]
    # the exact U-curve: more local steps save rounds until client drift puts the floor above eps
    assert g["10"]["rounds_to_eps"] < g["1"]["rounds_to_eps"]
    assert g["200"]["rounds_to_eps"] == "inf" and g["200"]["stationary_w2_squared"] > 0.1
    assert (tmp_path / "fahmc-local-steps" / "rounds_vs_local_steps.png").exists()


def test_list_settings_are_checked():
    assert_one_line_error(fedmcmc("reproduce", "fahmc-vs-fald", "--set", "step_sizes=0.1,x"), "step_sizes",
                          "separated by commas")
    assert_one_line_error(fedmcmc("reproduce", "fahmc-local-steps", "--set", "local_steps=1,2.5"), "integer")


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
        (base.replace('name = "fa-hmc"', 'name = "fa-ld"'), "fa-ld takes one leapfrog step"),
        (base.replace('name = "fa-hmc"', 'name = "qlsd#"'), "FA-HMC settings"),
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
        assert_one_line_error(fedmcmc("run", path, "--out", tmp_path / f"o{i}", "--no-progress"), fragment)
