"""The FSGLD Table 1 analogue (``cgdsgld-mlp``): its metric, and a tiny run's structure."""

import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.estimators import surrogates
from fedmcmc.data import from_clients, load_dataset
from fedmcmc.app.studies import cgdsgld_mlp, get
from fedmcmc.app.studies.runner import run_study
from fedmcmc.models import gaussian_mean, mlp, mlp_layout
from fedmcmc.samplers import cg_dsgld


def test_log_likelihood_per_datum_is_log_of_averaged_probabilities():
    # a 3-2-1 ReLU net, 4 draws, 5 points: log((1/T) sum_t sigmoid(+-z_t)) averaged over points, by hand
    rng = np.random.default_rng(0)
    model = mlp(3, hidden=(2,), num_classes=1)
    layout = mlp_layout(3, (2,), 1)
    draws = rng.normal(size=(4, model.dim)).astype(np.float32)
    x = rng.normal(size=(5, 3)).astype(np.float32)
    y = np.array([0, 1, 1, 0, 1])
    probs = []
    for theta in draws:
        p = {k: np.asarray(v, np.float64) for k, v in layout.unflatten(theta).items()}
        z = np.maximum(x @ p["dense1/w"] + p["dense1/b"], 0) @ p["dense2/w"][:, 0] + p["dense2/b"][0]
        probs.append(np.where(y == 1, 1 / (1 + np.exp(-z)), 1 / (1 + np.exp(z))))
    expected = np.mean(np.log(np.mean(probs, axis=0)))
    got = cgdsgld_mlp.log_likelihood_per_datum(model, draws[None], x, y)
    assert got == pytest.approx(expected, abs=1e-5)
    # not the average of the per-draw log-likelihoods, which Jensen puts strictly below
    per_draw = cgdsgld_mlp.log_likelihood_per_draw(model, draws[None], x, y, chunk=3)
    assert per_draw == pytest.approx(np.mean(np.log(probs)), abs=1e-5) and per_draw < got - 1e-3


def test_paper_network_has_three_hidden_layers_18_18_8():
    # "three hidden layers ... 18 nodes each, and the last one of 8": 10 inputs (MAGIC), 1 logit
    cfg = cgdsgld_mlp.FULL
    split, _, _, _, model, theta0 = cgdsgld_mlp.problem(load_dataset("keel:magic"), 0, 0.5, cfg)
    assert cfg["hidden"] == [18, 18, 8]
    assert model.dim == theta0.size == (10 * 18 + 18) + (18 * 18 + 18) + (18 * 8 + 8) + (8 + 1)
    assert set(mlp_layout(10, (18, 18, 8), 1).unflatten(theta0)) == {f"dense{i}/{p}" for i in range(1, 5) for p in "wb"}
    assert np.bincount(split.y_test).tolist() == [1338, 1338]  # the balanced test shard


@pytest.mark.slow
def test_likelihood_only_surrogates_exclude_the_prior():
    # Gaussian mean, unit noise, prior N(0, 4 I): the Taylor surrogate of shard s is exact, with
    # precision N_s alone for the local likelihood and N_s + f_s / 4 with the prior share f_s
    data = from_clients([np.full((n, 2), float(n)) for n in (3, 5)])
    model, f = gaussian_mean(2, prior_scale=2.0), np.array([0.25, 0.75])
    for likelihood_only, prior_share in ((True, 0.0), (False, 1.0)):
        sampler = cg_dsgld(model, f, 1e-3, 2, surrogate=surrogates.taylor("diag"), likelihood_only=likelihood_only)
        _, broadcast = sampler.init(None, jnp.zeros(2))
        for i, n in enumerate((3, 5)):
            state = sampler.client_init(None, broadcast, data.client(i))
            _, q_s, _ = sampler.setup.client(None, state, broadcast, data.client(i))
            np.testing.assert_allclose(q_s.precision, n + prior_share * f[i] / 4, rtol=1e-6)
            np.testing.assert_allclose(q_s.shift, n * n, rtol=1e-6)  # the data's sum; the prior adds 0 at mean 0


TINY = dict(num_seeds=2, num_shards=4, hidden=[4], betas=[0.5], iterations=200, burn_in=100, local_updates=50,
            thinning=50, surrogate_steps=20, surrogate_burn_in=10, methods=["SGLD", "FSGLD"])


@pytest.mark.slow
def test_tiny_run_structure(tmp_path):
    assert get("cgdsgld-mlp") is cgdsgld_mlp
    r = run_study(cgdsgld_mlp, tmp_path, quick=True, progress=False, settings=TINY)
    assert list(r["partitions"]) == ["Beta(0.5, 0.5)"]
    part = r["partitions"]["Beta(0.5, 0.5)"]
    assert part["num_train_used"] == [4 * (5350 // 4)] * 2  # 5,350 hadrons in the 80% training part
    assert part["num_test"] == 2 * 1338  # every test hadron and as many gammas
    assert part["label_skew_tv"]["mean"] > 0.1  # Beta(0.5, 0.5) shares: far from the pooled proportion
    assert set(part["methods"]) == {"SGLD", "FSGLD"}
    for m in part["methods"].values():
        assert set(m) == set(cgdsgld_mlp.METRICS)
        for s in m.values():
            assert len(s["per_seed"]) == 2 and np.isfinite(s["se"])
            assert s["mean"] == pytest.approx(np.mean(s["per_seed"]))
        assert all(v < 0 for v in m["train_log_likelihood"]["per_seed"] + m["test_log_likelihood"]["per_seed"])
        # Jensen: the model average's log-likelihood is at least the draws' mean
        assert all(a >= b - 1e-6 for a, b in zip(m["test_log_likelihood"]["per_seed"],
                                                 m["test_log_likelihood_per_draw"]["per_seed"]))
        assert all(0 <= v <= 1 for v in m["train_accuracy"]["per_seed"] + m["test_accuracy"]["per_seed"])
    assert r["model"]["dim"] == 10 * 4 + 4 + 4 + 1
    # 200 SGLD steps learn: the model average fits the training shards better than the starting point
    cfg = dict(cgdsgld_mlp.QUICK, **TINY)
    split, _, _, (x_tr, y_tr), model, theta0 = cgdsgld_mlp.problem(
        load_dataset("keel:magic"), 0, 0.5, cfg)
    start = cgdsgld_mlp.log_likelihood_per_datum(model, np.asarray(theta0)[None], x_tr, y_tr)
    assert part["methods"]["SGLD"]["train_log_likelihood"]["per_seed"][0] > start + 0.05
    for name in ("results.json", "log_likelihood.png", "posterior.nc"):
        assert (tmp_path / name).stat().st_size > 0


@pytest.mark.parametrize("settings, fragment", [
    (dict(methods=["SGLD", "FSGDL"]), "unknown methods"),
    (dict(local_updates=30), "must divide"),
    (dict(betas=[0.0]), "must be > 0"),
    (dict(dataset="digits"), "binary"),
])
def test_bad_settings_raise_one_line_errors(tmp_path, settings, fragment):
    with pytest.raises(ValueError, match=fragment) as err:
        run_study(cgdsgld_mlp, tmp_path, quick=True, progress=False, settings=settings)
    assert "\n" not in str(err.value)
