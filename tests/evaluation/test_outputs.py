"""The outputs a practitioner reads: the InferenceData against ArviZ's own checks, summary.json
against the evaluation functions on the same draws, the convergence warnings, the regression
predictive against closed forms."""

import json
import warnings
from types import SimpleNamespace
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fedmcmc import evaluation as ev
from fedmcmc.app import outputs
from fedmcmc.app.outputs import original_scale, write_outputs, write_run
from fedmcmc.data import load_dataset, local, split_and_standardise
from fedmcmc.evaluation import regression
from fedmcmc.models import (linear_regression, linear_regression_unknown_noise, logistic_regression,
                            multinomial_logistic_regression, with_intercept)
from fedmcmc.runtime import io
from fedmcmc.runtime.records import SimulationResult

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

CLIENTS = 3


class Inputs(NamedTuple):
    """The fields of a run's inputs that its outputs read."""
    task: str
    feature_names: list
    clients: list
    scaling: dict | None = None
    target_scaling: dict | None = None


#: The config of the breast-cancer runs: their model has no intercept.
CFG = {"model": {"name": "logistic", "intercept": False}, "sampler": {"step_size": 0.01}}


def result_of(samples, bits=100):
    """A SimulationResult around given draws ``[chain, draw, d]`` (one round per draw)."""
    c, n = samples.shape[:2]
    ones = np.ones((c, n), np.int64)
    return SimulationResult(samples, np.arange(1, n + 1), bits * ones, 2 * bits * ones, CLIENTS * ones, None,
                            np.full(c, bits * n + 7), np.full(c, 2 * bits * n), n, 0, 1, 0.0)


@pytest.fixture(scope="module")
def breast_cancer():
    """Three clients' held-out parts of breast-cancer, a logistic model and draws near its mode."""
    from sklearn.linear_model import LogisticRegression

    split = split_and_standardise(load_dataset("breast-cancer"), seed=0, test_fraction=0.3)
    fit = LogisticRegression(C=1.0, fit_intercept=False, max_iter=1000).fit(split.x_train, split.y_train)
    rng = np.random.default_rng(0)
    draws = (fit.coef_[0] + 0.1 * rng.standard_normal((4, 120, 30))).astype(np.float32)
    cuts = np.split(np.arange(len(split.y_test)), [40, 100])
    tests = tuple((split.x_test[i].astype(np.float32), split.y_test[i]) for i in cuts)
    return logistic_regression(30), draws, tests


@pytest.fixture(scope="module")
def written(breast_cancer, tmp_path_factory):
    model, draws, tests = breast_cancer
    out = tmp_path_factory.mktemp("run")
    inputs = Inputs("classification", [f"f{i}" for i in range(30)], [])
    built = SimpleNamespace(model=model, sampler=SimpleNamespace(name="qlsd++"), tests=tests, inputs=inputs,
                            step={"value": 0.01, "rule": "given"}, privacy=None)
    lines = []
    summary = write_run(out, CFG, built, result_of(draws), echo=lines.append)
    return out, summary, lines


@pytest.mark.slow
def test_inference_data_follows_the_schema_and_arviz_runs_on_it(written, breast_cancer):
    out, _, _ = written
    _, draws, tests = breast_cancer
    idata = az.from_netcdf(out / "posterior.nc")
    assert set(idata.groups()) == {"posterior", "sample_stats", "log_likelihood", "observed_data"}
    theta = idata.posterior["theta"]
    assert theta.dims == ("chain", "draw", "theta_dim") and list(theta["theta_dim"].values[:2]) == ["f0", "f1"]
    assert {"step_size", "bits_up", "bits_down"} <= set(idata.sample_stats.data_vars)
    np.testing.assert_array_equal(idata.sample_stats["step_size"].values, np.full((4, 120), 0.01))
    ll = idata.log_likelihood["y"]
    n = sum(len(y) for _, y in tests)
    assert ll.dims == ("chain", "draw", "obs") and ll.shape == (4, 120, n)
    np.testing.assert_array_equal(ll["client"].values, np.repeat([0, 1, 2], [len(y) for _, y in tests]))
    np.testing.assert_array_equal(idata.observed_data["y"].values, np.concatenate([y for _, y in tests]))
    assert json.loads(idata.attrs["config"]) == CFG
    assert json.loads(idata.attrs["step"]) == {"value": 0.01, "rule": "given"}
    assert all(idata[g].attrs["inference_library"] == "fedmcmc" for g in idata.groups())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loo, waic = az.loo(idata), az.waic(idata)
    assert np.isfinite(loo.elpd_loo) and np.isfinite(waic.elpd_waic) and loo.n_data_points == n
    assert az.summary(idata).shape[0] == 30 and az.rhat(idata)["theta"].shape == (30,)


def test_release_draws_writes_the_posterior_and_what_the_draws_give_alone(written, breast_cancer, tmp_path):
    """[privacy] release = "draws": posterior.nc holds the posterior group alone (the same draws),
    summary.json no bits, no held-out metrics and no client counts; no reliability diagram."""
    model, draws, tests = breast_cancer
    inputs = Inputs("classification", [f"f{i}" for i in range(30)], [{"source": "a", "n_train": 9, "n_test": 3}])
    built = SimpleNamespace(model=model, sampler=SimpleNamespace(name="qlsd#"), tests=tests, inputs=inputs,
                            step={"value": 0.01, "rule": "given"}, privacy={"release": "draws", "client": {}})
    summary = write_run(tmp_path, CFG, built, result_of(draws), echo=lambda _: None)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk.pop("provenance")["commit"]  # the file records the commit and machine that wrote it
    assert on_disk == json.loads(json.dumps(summary)) and "bits" not in summary and summary["predictive"] is None
    assert summary["settings"]["inputs"]["clients"] == [] and summary["settings"]["privacy"]["release"] == "draws"
    assert not (tmp_path / "reliability.png").exists() and (tmp_path / "trace.png").exists()
    released = az.from_netcdf(str(tmp_path / "posterior.nc"))
    assert released.groups() == ["posterior"] and "privacy" in released.attrs
    full = az.from_netcdf(str(written[0] / "posterior.nc"))
    assert {"sample_stats", "log_likelihood", "observed_data"} <= set(full.groups())
    np.testing.assert_array_equal(released.posterior.theta.values, full.posterior.theta.values)


def test_log_likelihood_is_the_models_per_point_log_likelihood(written, breast_cancer):
    out, _, _ = written
    model, draws, tests = breast_cancer
    ll = az.from_netcdf(out / "posterior.nc").log_likelihood["y"].values
    x, y = tests[1]
    offset = len(tests[0][1])
    for c, d in [(0, 0), (3, 119), (2, 57)]:
        direct = [float(model.log_likelihood(jnp.asarray(draws[c, d]), (x[i], y[i]))) for i in range(len(y))]
        np.testing.assert_allclose(ll[c, d, offset:offset + len(y)], direct, rtol=1e-5, atol=1e-6)


def test_summary_equals_the_evaluation_functions_on_the_same_draws(written, breast_cancer):
    out, summary, _ = written
    model, draws, tests = breast_cancer
    assert json.loads((out / "summary.json").read_text())["predictive"] == json.loads(json.dumps(summary["predictive"]))
    probs = [ev.bayes_average(ev.predict_draws(model, draws, x)) for x, _ in tests]
    for p, (_, y), got in zip(probs, tests, summary["predictive"]["clients"]):
        assert got["accuracy"] == ev.accuracy(p, y) and got["brier"] == pytest.approx(ev.brier(p, y), rel=1e-9)
        assert got["nll"] == pytest.approx(ev.nll(p, y), rel=1e-9) and got["ece"] == pytest.approx(ev.ece(p, y), rel=1e-9)
    y_all = np.concatenate([y for _, y in tests])
    assert summary["predictive"]["overall"]["nll"] == pytest.approx(ev.nll(np.concatenate(probs), y_all), rel=1e-9)
    rhat = np.asarray(az.rhat(az.convert_to_dataset(draws))["x"])
    np.testing.assert_allclose([p["r_hat"] for p in summary["convergence"]["parameters"].values()], rhat, rtol=1e-12)
    assert list(summary["convergence"]["parameters"])[:2] == ["theta[f0]", "theta[f1]"]
    assert summary["bits"]["up_per_chain"] == 100 * 120 + 7 and summary["bits"]["down_per_round"] == 200
    for name in ("trace.png", "rank.png", "reliability.png"):
        assert (out / name).stat().st_size > 1000


def test_warnings_fire_on_unmixed_chains_and_not_on_mixed_ones(tmp_path, breast_cancer):
    rng = np.random.default_rng(1)
    mixed = rng.standard_normal((4, 500, 2))
    assert ev.convergence(mixed)["warnings"] == []
    stuck = mixed[:2].copy()
    stuck[1] += 3.0  # two chains in different places: R-hat far above 1.01
    report = ev.convergence(stuck)
    assert report["warnings"][0].startswith("R-hat > 1.01 (or undefined) for 2 of 2 parameters (worst x[")
    assert report["warnings"][0].endswith("the chains disagree; run more iterations, more burn-in or a smaller step "
                                          "size")
    slow = np.cumsum(1e-3 * np.random.default_rng(2).standard_normal((2, 500, 2)), axis=1)
    slow[1] += 3.0
    advice = ev.convergence(slow)["warnings"][0]  # chains that barely move: a smaller step cannot help
    assert "barely moved" in advice and 'step_size = "auto"' in advice and "smaller step" not in advice
    few = ev.convergence(rng.standard_normal((2, 50, 2)))  # about 100 effective draws
    assert [w[:14] for w in few["warnings"]] == ["bulk ESS < 400"]
    model = breast_cancer[0]
    lines = []
    summary = write_outputs(tmp_path, result_of(np.repeat(stuck[..., :1], 30, axis=-1).astype(np.float32)), model,
                            echo=lines.append)
    assert summary["warnings"] and lines == [f"fedmcmc: warning: {w}" for w in summary["warnings"]]
    assert summary["num_draws"] == summary["num_stored_draws"] == 500


def test_a_models_layout_names_the_posterior_and_reads_back():
    model = multinomial_logistic_regression(4, 3)
    draws = np.random.default_rng(2).standard_normal((2, 6, model.dim)).astype(np.float32)
    idata = io.to_inference_data({"run": result_of(draws)}, layout=model.layout)
    assert set(idata.posterior.data_vars) == set(model.layout.names)
    w = idata.posterior[model.layout.names[0]]
    assert w.dims == ("chain", "draw", f"{model.layout.names[0]}_dim_0", f"{model.layout.names[0]}_dim_1")
    np.testing.assert_array_equal(io.flat_draws(idata.posterior, model.layout), draws)


def test_thinning_sums_each_stored_draws_bits():
    r = result_of(np.zeros((2, 10, 1), np.float32))
    r = r._replace(bits_up=np.arange(20).reshape(2, 10))
    idata = io.to_inference_data({"run": r}, max_draws=3)  # every 4th draw: windows 0-3, 4-7
    np.testing.assert_array_equal(idata.sample_stats["bits_up"].values, [[6, 22], [46, 62]])
    np.testing.assert_array_equal(idata.posterior["draw"].values, [4, 8])


def test_regression_interval_and_nll_against_the_gaussian_mixture():
    rng = np.random.default_rng(3)
    model = linear_regression(2, noise_scale=0.5)
    draws = (np.array([1.0, -2.0]) + 0.1 * rng.standard_normal((2, 40, 2))).astype(np.float32)
    x = rng.standard_normal((25, 2)).astype(np.float32)
    y = x @ np.array([1.0, -2.0]) + 0.5 * rng.standard_normal(25)
    mu, var = regression.predictive_draws(model, draws, x)
    np.testing.assert_allclose(var, 0.25, rtol=1e-5)  # the noise read from the curvature is the model's
    np.testing.assert_allclose(mu, draws.reshape(-1, 2) @ x.T, rtol=1e-5, atol=1e-5)
    q = regression.mixture_quantiles(mu[:1], var[:1], [0.03, 0.97])  # one component: the normal's quantiles
    np.testing.assert_allclose(q, stats.norm.ppf([[0.03], [0.97]], mu[:1], 0.5), atol=1e-6)
    pred = ev.predictive_interval(model, draws, x, level=0.9)
    cdf = stats.norm.cdf((pred.upper[None] - mu) / 0.5).mean(axis=0) - stats.norm.cdf((pred.lower[None] - mu) / 0.5).mean(axis=0)
    np.testing.assert_allclose(cdf, 0.9, atol=1e-6)
    got = ev.regression_report(model, draws, x, y, level=0.9)
    density = stats.norm.pdf(y[None], mu, 0.5).mean(axis=0)
    assert got["nll"] == pytest.approx(-np.log(density).mean(), rel=1e-5)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((mu.mean(axis=0) - y) ** 2)), rel=1e-6)
    assert got["coverage"] == np.mean((pred.lower <= y) & (y <= pred.upper))


def test_several_runs_share_a_method_dimension():
    rng = np.random.default_rng(4)
    runs = {"a": result_of(rng.standard_normal((2, 8, 3))), "b": result_of(rng.standard_normal((2, 8, 3)), bits=5)}
    idata = io.to_inference_data(runs, {"experiment": "x"})
    assert idata.posterior["theta"].dims == ("chain", "draw", "method", "theta_dim")
    np.testing.assert_array_equal(idata.posterior["theta"].isel(method=1).values, runs["b"].samples)
    np.testing.assert_array_equal(idata.sample_stats["bits_up"].isel(method=1).values, np.full((2, 8), 5))
    with pytest.raises(ValueError, match="describe one run"):
        io.to_inference_data(runs, step_size=0.1)


def test_original_scale_against_a_hand_computation():
    """Per draw: slope_j = s_y b_j / s_j, intercept = m_y + s_y (b_0 - sum_j b_j m_j / s_j), sigma =
    s_y exp(log sigma); the same predictions as the standardised model on raw rows."""
    rng = np.random.default_rng(5)
    draws = rng.normal(size=(2, 3, 4))  # intercept, two slopes, log sigma
    scaling = local.Scaling(np.array([100.0, 50.0]), np.array([15.0, 5.0]))
    target = local.Scaling(np.array(120.0), np.array(20.0))
    got = original_scale(draws, "linear", scaling, target, unknown_noise=True)
    assert set(got) == {"coef", "sigma"} and got["coef"].shape == (2, 3, 3)
    for c, d in [(0, 0), (1, 2)]:
        b0, b1, b2, log_sigma = draws[c, d]
        expected = [120 + 20 * (b0 - b1 * 100 / 15 - b2 * 50 / 5), 20 * b1 / 15, 20 * b2 / 5]
        np.testing.assert_allclose(got["coef"][c, d], expected, rtol=1e-12)
        assert got["sigma"][c, d] == pytest.approx(20 * np.exp(log_sigma), rel=1e-12)
        x = rng.normal([100.0, 50.0], [15.0, 5.0], size=(4, 2))
        standardised = 120 + 20 * (b0 + ((x - scaling.mean) / scaling.scale) @ [b1, b2])
        np.testing.assert_allclose(got["coef"][c, d, 0] + x @ got["coef"][c, d, 1:], standardised, rtol=1e-10)
    logistic = original_scale(draws[..., :3], "logistic", scaling, target)  # a class label is not scaled
    np.testing.assert_allclose(logistic["coef"][..., 1], draws[..., 1] / 15, rtol=1e-12)
    np.testing.assert_allclose(logistic["odds_ratio"], np.exp(logistic["coef"][..., 1:]), rtol=1e-12)
    np.testing.assert_array_equal(original_scale(draws, "linear", unknown_noise=True)["coef"], draws[..., :3])
    with pytest.raises(ValueError, match="2 scaled features"):
        original_scale(draws, "linear", scaling, target)


@pytest.mark.slow
def test_a_standardised_regression_target_is_read_in_its_own_units(tmp_path):
    """write_run of linear regression with unknown noise on a standardised target (mean 120,
    scale 20): held-out log-likelihood, observed data and RMSE/NLL in the target's units, the
    original-scale coefficients and sigma in posterior.nc, summary.csv and the printed table."""
    rng = np.random.default_rng(6)
    m, s = 120.0, 20.0
    scaling = {"mean": [10.0, 0.0, -5.0], "scale": [2.0, 1.0, 4.0]}
    model = with_intercept(linear_regression_unknown_noise(4))
    draws = (np.array([0.1, 0.5, -0.3, 0.2, np.log(0.4)]) + 0.05 * rng.standard_normal((2, 50, 5))).astype(np.float32)
    x = rng.standard_normal((20, 3)).astype(np.float32)  # standardised inputs, as load_data gives them
    y_std = 0.1 + x @ np.array([0.5, -0.3, 0.2]) + 0.4 * rng.standard_normal(20)
    tests = ((x[:12], (m + s * y_std[:12]).astype(np.float32)), (x[12:], (m + s * y_std[12:]).astype(np.float32)))
    inputs = Inputs("regression", ["a", "b", "c"], [], scaling, {"mean": m, "scale": s})
    built = SimpleNamespace(model=model, sampler=SimpleNamespace(name="lsd*"), tests=tests, inputs=inputs,
                            step={"value": 0.01, "rule": "given"}, privacy=None)
    printed = []
    summary = write_run(tmp_path, {"model": {"name": "linear"}}, built, result_of(draws), echo=lambda _: None,
                        show=printed.append)
    labels = ["coef[intercept]", "coef[a]", "coef[b]", "coef[c]", "sigma"]
    assert [row["parameter"] for row in summary["table"]] == labels
    table = pd.read_csv(tmp_path / "summary.csv")
    assert list(table["parameter"]) == labels and list(table.columns[1:]) == list(outputs.TABLE_COLUMNS)
    assert len(printed) == 1 and all(label in printed[0] for label in labels)
    idata = az.from_netcdf(tmp_path / "posterior.nc")
    assert list(idata.posterior["theta"]["theta_dim"].values) == ["intercept", "a", "b", "c", "log_sigma"]
    expected = original_scale(draws, "linear", local.scaling_from(scaling),
                              local.Scaling(np.array(m), np.array(s)), unknown_noise=True)
    np.testing.assert_allclose(idata.posterior["coef"].values, expected["coef"], rtol=1e-12)
    np.testing.assert_allclose(idata.posterior["sigma"].values, expected["sigma"], rtol=1e-12)
    assert az.summary(idata).shape[0] == 5 + 4 + 1
    assert list(summary["convergence"]["parameters"])[-1] == "theta[log_sigma]"  # the model's coordinates
    np.testing.assert_allclose(idata.observed_data["y"].values, m + s * y_std, rtol=1e-6)
    standardised = [float(model.log_likelihood(jnp.asarray(draws[1, 7]), (x[i], y_std[i]))) for i in range(20)]
    np.testing.assert_allclose(idata.log_likelihood["y"].values[1, 7], np.array(standardised) - np.log(s),
                               rtol=1e-5, atol=1e-5)
    y_all = np.concatenate([y for _, y in tests])
    got, ref = summary["predictive"]["overall"], ev.regression_report(model, draws, x, y_std)
    assert got["rmse"] == pytest.approx(s * ref["rmse"], rel=1e-4)
    assert got["nll"] == pytest.approx(ref["nll"] + np.log(s), rel=1e-4)
    assert got["coverage"] == ref["coverage"] and got["num_points"] == len(y_all)


def test_the_posterior_table_leaves_out_a_parameter_it_cannot_summarise_and_only_that_one():
    import arviz as az

    from fedmcmc.app.outputs import posterior_table

    coef = np.random.default_rng(0).normal(size=(2, 100, 3)) * [1.0, 1.0, 300.0]  # a feature with a tiny unit
    with np.errstate(over="ignore"):
        odds = np.exp(coef)
    table = posterior_table(az.from_dict(posterior={"coef": coef, "odds_ratio": odds}), ["coef", "odds_ratio"])
    assert list(table.index) == ["coef[0]", "coef[1]", "coef[2]", "odds_ratio[0]", "odds_ratio[1]"]
    assert np.isfinite(table.to_numpy()).all()
