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
from fedmcmc.runtime.settings import RunSettings

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


@pytest.mark.slow
def test_run_prints_and_records_the_chosen_step(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(sampler="qlsd*", extra="compression = { bits = 4 }"))
    proc = subprocess.run([sys.executable, "-m", "fedmcmc", "run", path, "--out", tmp_path / "out", "--no-progress"],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    step = json.loads((tmp_path / "out" / "results.json").read_text())["step"]
    assert set(step) >= {"value", "rule", "lambda_max", "rounds", "bits"} and "Thm S6" in step["rule"]
    assert f"step_size = auto: {step['value']:.4g}" in proc.stdout
    # QLSD* needs the mode anyway (counted as theta_star): the step costs one round of the 4 clients'
    # Hessians (3 parameters: their 6-number triangles up, theta down)
    assert step["rounds"] == 1 and step["bits"] == 4 * 32 * (6 + 3)
    # whitened ([run] whiten = "auto"): the curvature the step sees is 1; the Hessian round is the
    # posterior check's, the whitening adds the broadcast of theta* and L (3 + 6 numbers to 4 clients)
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert abs(step["lambda_max"] - 1) < 1e-3
    assert results["whitening"] == {"used": True, "full": True, "rounds": 1, "bits": 4 * 32 * (3 + 6)}
    assert "whiten: the sampler runs in z" in proc.stdout
    assert results["posterior_mean_error"] < 0.5 and results["laplace"]["rounds"] == 1  # draws back in theta
    # the clients' pulls at the mode (B*), in theta and in posterior sds
    assert results["heterogeneity"]["clients"] == 4 and 0 < results["heterogeneity"]["b_star_in_sds"]
    # 2 chains of 400 rounds at a Langevin step gamma ~ 0.07 on a whitened posterior (m = 1): ~1 / gamma
    # rounds per independent draw, ~2 x 400 / (2 / gamma) effective draws, too few: said, with the fix
    assert step["rounds_per_draw"] == pytest.approx(1 / (step["lambda_min"] * step["value"]))
    assert step["expected_ess"] == pytest.approx(2 * 400 / (2 * step["rounds_per_draw"]))
    assert step["rounds_needed"] == int(np.ceil(400 * 2 * step["rounds_per_draw"] / 2))
    assert (f"fedmcmc: warning: at this step a chain needs about {step['rounds_per_draw']:.3g} rounds"
            in proc.stderr and f"set num_iterations >= {step['rounds_needed']}" in proc.stderr)


@pytest.mark.slow
def test_a_long_enough_run_draws_no_budget_warning():
    from fedmcmc.app import auto_step

    text = CONFIG.format(sampler="qlsd*", extra="compression = { bits = 4 }")
    built = config.build(tomllib.loads(text.replace("num_iterations = 400", "num_iterations = 20000")))
    assert built.step["expected_ess"] >= auto_step.MIN_ESS and "rounds_needed" not in built.step
    assert auto_step.budget_warning(built.step, RunSettings(num_chains=2, num_iterations=20000)) is None
    given = config.build(tomllib.loads(text.replace('"auto"', "0.001")))
    assert "expected_ess" not in given.step  # a given step is the user's: no estimate


@pytest.mark.parametrize("sampler, extra", [("fedavg", "local_steps = 2"),
                                            ("dg-sgld", "rho = [0.1, 0.1, 0.01, 0.01]"),
                                            ("fa-hmc", 'num_leapfrog = 3\nlocal_steps = 2\nclock = "leapfrog"')])
def test_every_kind_of_step_is_set(sampler, extra):
    built = config.build(tomllib.loads(CONFIG.format(sampler=sampler, extra=extra)))
    assert built.step["rule"] != "given" and np.all(np.asarray(built.step["value"]) > 0)
    given = config.build(tomllib.loads(CONFIG.format(sampler=sampler, extra=extra).replace('"auto"', "0.001")))
    assert given.step == {"value": 0.001, "rule": "given"}


@pytest.mark.parametrize("sampler, extra, key, rule", [
    ("dg-sgld", 'rho = "auto"', "rho", "tolerance"),
    ("cg-dsgld", 'local_steps = 2\nsurrogate = "sgld"\nsurrogate_step_size = "auto"', "surrogate_step_size",
     "surrogate_step")])
def test_keys_set_from_the_same_curvature(sampler, extra, key, rule):
    """DG-SGLD's tolerance and CG-DSGLD's surrogate step, "auto" with the step: from its lambda_max."""
    from fedmcmc.samplers import steps

    built = config.build(tomllib.loads(CONFIG.format(sampler=sampler, extra=extra)))
    assert built.step[key] == pytest.approx(getattr(steps, rule)(built.step["lambda_max"]))
    assert np.all(np.asarray(built.step["value"]) > 0)


FA_LD = 'local_steps = 2\nstep_decay = "auto"'


def test_the_dynamic_step_starts_with_the_automatic_step_and_counts_its_slower_mixing():
    """FA-LD's ``step_decay = "auto"``: Proposition J.1's first stage at the automatic step, and the
    expected ESS from the decayed Langevin time, against the same run at the constant step."""
    from fedmcmc.samplers import schedules

    text = CONFIG.format(sampler="fa-ld", extra=FA_LD).replace("num_iterations = 400", "num_iterations = 20000")
    built = config.build(tomllib.loads(text))
    step = built.step
    assert step["step_decay"] == schedules.first_stage(step["lambda_min"], step["value"], 1, 2.0)
    constant = config.build(tomllib.loads(text.replace('step_decay = "auto"', ""))).step
    kept = schedules.decayed_rounds(step["step_decay"], 2.0, 0, 20000)
    assert step["expected_ess"] == pytest.approx(constant["expected_ess"] * kept / 20000)
    assert kept < 20000 / 4  # the decay costs mixing: a quarter of the draws or fewer here


def test_a_dynamic_step_that_cannot_reach_the_draws_says_so():
    from fedmcmc.app import auto_step

    text = CONFIG.format(sampler="fa-ld", extra=FA_LD.replace('"auto"', "2"))
    built = config.build(tomllib.loads(text))
    assert built.step["rounds_needed"] is None
    line = auto_step.budget_warning(built.step, built.settings.run)
    assert "no run length gives 400" in line and "drop step_decay" in line


def test_the_dynamic_step_is_not_accounted_by_privacy():
    text = CONFIG.format(sampler="fa-ld", extra="local_steps = 1\nstep_decay = 100").replace('"auto"', "0.01")
    built = config.build(tomllib.loads(text + "\n[privacy]\nclip = 1.0\ndelta = 1e-5\n"))
    assert "constant step" in json.dumps(built.privacy)


@pytest.mark.slow
def test_psgld_auto_is_one_clear_line(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(CONFIG.format(sampler="psgld", extra=""))
    proc = subprocess.run([sys.executable, "-m", "fedmcmc", "run", path, "--out", tmp_path / "out"],
                          capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().startswith("fedmcmc: error: psgld has no step_size = \"auto\"")
    assert not (tmp_path / "out").exists()
    with pytest.raises(config.ConfigError, match='step_size must be a positive number or "auto"'):
        config.validate(tomllib.loads(CONFIG.format(sampler="qlsd*", extra="").replace('"auto"', '"fast"')))
    for sampler, extra, key in (("dg-sgld", 'rho = "auto"', "rho"),
                                ("cg-dsgld", 'local_steps = 2\nsurrogate = "sgld"\nsurrogate_step_size = "auto"',
                                 "surrogate_step_size")):
        with pytest.raises(config.ConfigError, match=f'{key} must be a positive number, or "auto" with step_size'):
            config.validate(tomllib.loads(CONFIG.format(sampler=sampler, extra=extra).replace(
                'step_size = "auto"', "step_size = 0.01", 1)))


def _breast_cancer_split(num_clients):
    from fedmcmc.data import load_dataset, partition, split_and_standardise, with_intercept
    from fedmcmc.models import logistic_regression

    split = with_intercept(split_and_standardise(load_dataset("breast-cancer", task="classification"), 0))
    parts = partition.dirichlet(0, split.y_train, num_clients, 0.5, min_size=5)
    data = partition.federate(split.x_train.astype(np.float32), split.y_train.astype(np.float32), parts)
    return data, logistic_regression(split.x_train.shape[1])


@pytest.mark.slow
def test_auto_steps_give_the_nuts_widest_and_narrowest_sds_on_breast_cancer(tmp_path, monkeypatch):
    """Issue 16's acceptance test within this suite's budget: with step_size = "auto", the widest and
    the narrowest marginal standard deviations of QLSD++, FA-HMC and CG-DSGLD are within 10% of
    NUTS's, on the breast-cancer training split (455 x 31 with the intercept) over 5 clients with
    Dirichlet(0.5) label skew.

    Budget (< 60 s CPU): the widest marginals are the prior's (precision ~1) and lambda_max is ~67,
    so a Langevin chain at the rules' gamma ~ 1e-3 needs ~800 rounds per effective draw of a
    squared coordinate; 16 chains of 25,000 rounds from the mode, the first 2,000 (2 relaxation
    times) discarded, give an ESS of ~460 for every variance, a relative Monte-Carlo error of the
    sd of 1 / sqrt(2 ESS) = 3.3%, ~3.6% for the ratio with NUTS's (checked: below 4%). That is
    2.8 errors for 10% on one marginal, too few for the largest of 31 (docs/reproductions.md has
    every marginal, from 2.5 times longer runs); the rules are made for the widest and the
    narrowest. CG-DSGLD runs 2 local steps per visit (its rule makes a round's progress
    independent of the visit's length) and FA-HMC K = 10 leapfrog steps with T = 2 per round.
    QLSD++ draws half of each client's points: its rule counts the minibatch noise of the control
    variates, whose covariance on this data is 44 times lambda_min at half batches (410 at a tenth,
    a step 4 times smaller than half batches' 7e-4), so it runs 40,000 rounds for the same ESS.
    """
    from fedmcmc.compression import quantization
    from fedmcmc.evaluation import diagnostics, reference
    from fedmcmc.estimators import gradients, surrogates
    from fedmcmc.runtime.simulator import simulate
    from fedmcmc.samplers import REGISTRY
    from fedmcmc.app import auto_step

    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path))
    data, model = _breast_cancer_split(5)
    ref = reference.nuts(0, model, data, num_samples=800, num_chains=4, num_warmup=400)
    centred = ref.samples - ref.samples.mean(axis=(0, 1))
    ref_sd, ref_ess = np.sqrt(np.mean(centred**2, axis=(0, 1))), diagnostics.ess(centred**2)
    ends = [int(np.argmax(ref_sd)), int(np.argmin(ref_sd))]
    mode = gradients.find_mode(model, data)
    settings = {
        "qlsd++": (dict(batch_size=np.asarray(data.counts) // 2, compressor=quantization(256)), 40_000),
        "fa-hmc": (dict(weights=data.weights, num_leapfrog=10, local_steps=2), 8_000),
        "cg-dsgld": (dict(probs=data.weights, local_steps=2, surrogate=surrogates.taylor("full")), 25_000),
    }
    for name, (args, rounds) in settings.items():
        args = dict(args, model=model)
        value, record, _ = auto_step.auto_step(0, name, args, model, data, mode)
        res = simulate(0, REGISTRY[name].build(**args, step_size=value), data, np.asarray(mode.theta), rounds,
                       num_chains=16, burn_in=2_000)
        x = res.samples - res.samples.mean(axis=(0, 1))
        ratio = np.sqrt(np.mean(x**2, axis=(0, 1))) / ref_sd
        se = np.sqrt(1 / (2 * diagnostics.ess(x**2)) + 1 / (2 * ref_ess))
        print(f"{name}: step {value:.4g}, lambda_max {record['lambda_max']:.4g}, sd ratio widest {ratio[ends[0]]:.3f}, "
              f"narrowest {ratio[ends[1]]:.3f}, all in [{ratio.min():.3f}, {ratio.max():.3f}], "
              f"Monte-Carlo error <= {se.max():.3f}")
        assert se[ends].max() < 0.04, (name, se[ends])
        assert np.all(np.abs(ratio[ends] - 1) < 0.10), (name, value, ratio[ends])


def _ill_conditioned(n=400, clients=4):
    """Linear regression with features of scales 100, 1 and 0.01: posterior sds from 5e-4 to 1,
    curvatures from 1 to 4e6."""
    from fedmcmc.data import partition
    from fedmcmc.models import linear_regression, linear_regression_posterior

    rng = np.random.default_rng(0)
    x = (rng.normal(size=(n, 3)) * [100.0, 1.0, 0.01]).astype(np.float32)
    y = (x @ np.array([0.02, 1.0, -0.5]) + rng.normal(size=n)).astype(np.float32)
    data = partition.federate(x, y, np.array_split(np.arange(n), clients))
    return data, linear_regression(3), linear_regression_posterior(data)


def _whiten_config(whiten, step="auto", sampler="lsd*", **run):
    return {"sampler": {"name": sampler, "step_size": step},
            "run": {"seed": 0, "num_chains": 4, "num_iterations": 3000, "burn_in": 500, "whiten": whiten, **run}}


@pytest.mark.slow
def test_whitening_lets_the_automatic_step_sample_an_ill_conditioned_posterior():
    """LSD* with step_size = "auto" on a posterior of condition number 4e6: whitened, the draws'
    means and sds are the exact posterior's within 4 Monte-Carlo errors (from the ESS of the draws
    and of their squares), the sds after ULA's known inflation at the chosen step on a Gaussian,
    (1 - gamma / 2)^(-1/2) with curvature 1; with whiten = false the step is 2e-8 and the widest
    coordinate does not move (its within-chain sd below a tenth of the posterior's)."""
    from fedmcmc.evaluation import diagnostics
    from fedmcmc.runtime.simulator import simulate

    data, model, exact = _ill_conditioned()
    sd = np.sqrt(np.diag(exact.cov))
    widest = int(np.argmax(sd))
    for whiten in ("auto", False):
        cfg = _whiten_config(whiten)
        built = config.with_start(cfg, config.build_run(cfg, data, model, exact))
        r = cfg["run"]
        res = simulate(0, built.sampler, built.data, built.start, r["num_iterations"], num_chains=r["num_chains"],
                       burn_in=r["burn_in"])
        draws = config.in_theta(built, res).samples.astype(np.float64)
        within = draws.std(axis=1).mean(axis=0) / sd
        if whiten is False:
            assert built.whitening == (None, {"used": False, "why": "[run] whiten = false"})
            assert built.step["value"] < 1e-7 and within[widest] < 0.1, (built.step["value"], within)
            continue
        assert built.whitening[1]["used"] and abs(built.step["lambda_max"] - 1) < 1e-3
        centred = draws - draws.mean(axis=(0, 1))
        mean_error = np.abs(draws.mean(axis=(0, 1)) - exact.mean) / (sd / np.sqrt(diagnostics.ess(draws)))
        inflated = sd / np.sqrt(1 - built.step["value"] / 2)
        sd_error = np.abs(centred.std(axis=(0, 1)) / inflated - 1) / np.sqrt(1 / (2 * diagnostics.ess(centred**2)))
        assert mean_error.max() < 4 and sd_error.max() < 4, (mean_error, sd_error)


@pytest.mark.slow
def test_whitening_records_its_cost_or_why_it_is_off():
    from fedmcmc.estimators import approximation

    data, model, exact = _ill_conditioned()
    broadcast = 4 * 32 * (6 + 3)  # theta* and the triangle of L to each of 4 clients
    built = config.build_run(_whiten_config(True, posterior_check=False, init="zeros"), data, model, exact)
    hessian = approximation.laplace_approximation(model, data, built.mode).bits
    # nothing else needs the Hessian round: the whitening pays for it (the mode is LSD*'s)
    assert built.whitening[1] == {"used": True, "full": True, "rounds": 2, "bits": hessian + broadcast}
    given = config.build_run(_whiten_config(True, step=1e-3, sampler="qlsd#"), data, model, exact)
    assert given.whitening[1] == {"used": True, "full": True, "rounds": 1, "bits": broadcast}
    assert given.step == {"value": 1e-3, "rule": "given"} and given.mode is None
    assert given.laplace[1]["rounds"] > 1  # the mode was searched for the check's approximation, counted there
    off = config.build_run(_whiten_config("auto", step=1e-3), data, model, exact)
    assert off.whitening[0] is None and 'step_size is given, not "auto"' in off.whitening[1]["why"]


@pytest.mark.parametrize("change, message", [
    ({"run": {"whiten": "yes"}}, r'\[run\] whiten must be "auto", true or false'),
    ({"privacy": {"delta": 1e-5}}, r"whiten = true needs .*\[privacy\]: its accountant does not cover"),
    ({"model": {"name": "mlp"}}, r"whiten = true needs .*mlp network"),
])
def test_whitening_refusals_are_one_line(change, message):
    from fedmcmc.app import whiten

    cfg = _whiten_config(True)
    cfg = {**cfg, **change, "run": {**cfg["run"], **change.get("run", {})}}
    with pytest.raises(config.ConfigError, match=message) as err:
        whiten.setting(cfg)
    assert "\n" not in str(err.value)


FA_HMC_LAW = 'num_leapfrog = "auto"\nlocal_steps = 1\nclock = "trajectory"\ncorrelation = 1.0'


def test_fa_hmc_chooses_its_trajectory_from_the_exact_law_of_its_round():
    """``num_leapfrog = "auto"``: the step and K of :func:`fedmcmc.samplers.fa_hmc_law.choose` on the
    clients' Hessians and gradients at the mode (the rounds the step asks anyway), in the record and
    the expected ESS, and printed."""
    from fedmcmc.app import auto_step
    from fedmcmc.samplers import steps

    text = CONFIG.format(sampler="fa-hmc", extra=FA_HMC_LAW).replace("num_iterations = 400", "num_iterations = 2000")
    built = config.build(tomllib.loads(text))
    step = built.step
    assert isinstance(step["num_leapfrog"], int) and step["num_leapfrog"] >= 1
    low, high = step["law"]["sd_ratios"]
    assert 1 / (1 + steps.STD_INFLATION) <= low <= high <= 1 + steps.STD_INFLATION
    assert step["law"]["mean_offset_sds"] <= steps.MEAN_OFFSET
    assert step["rounds_per_draw"] == pytest.approx(step["law"]["autocorrelation_rounds"] / 2)
    assert "fa_hmc_law" in step["rule"] and f"num_leapfrog = {step['num_leapfrog']}" in auto_step.describe(step)


@pytest.mark.parametrize("extra, why", [
    ('num_leapfrog = "auto"\nlocal_steps = 1\nclock = "leapfrog"', 'clock = "trajectory"'),
    ('num_leapfrog = "auto"\nlocal_steps = 1\nclock = "trajectory"\nbatch_fraction = 0.5', "full batches"),
])
def test_the_exact_law_trajectory_is_refused_where_the_law_does_not_hold(extra, why):
    with pytest.raises(ValueError, match=why):  # the CLI's one line and exit code 2
        config.build(tomllib.loads(CONFIG.format(sampler="fa-hmc", extra=extra)))
