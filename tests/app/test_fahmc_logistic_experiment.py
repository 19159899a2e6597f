"""FA-HMC on Fashion-MNIST (Liang et al. 2024, Section 5.3): tiny settings of the reproduction,
the BMA scoring and the PCA reduction its quick setting uses."""

from pathlib import Path

import numpy as np
import pytest

from fedmcmc import evaluation
from fedmcmc.data import Split, builtin, pca_project
from fedmcmc.app.studies import fahmc_logistic as E
from fedmcmc.app.studies import get
from fedmcmc.app.studies.runner import run_study

TINY = dict(train_subset=3000, test_subset=1000, pca_components=20, batch_size=50, step_sizes=[3e-3],
            num_runs=2, leapfrog_sweep=[1, 10], sweep_local_steps=5, local_steps_sweep=[5],
            sweep_leapfrog=10, rounds=6, accuracy_targets=[0.6, 0.7])


def _fashion_or_skip():
    folder = Path(builtin.FASHION_MNIST_DIR)
    if not all(any((folder / (f + ext)).is_file() for ext in (".gz", "")) for f in builtin.FASHION_MNIST_FILES):
        pytest.skip(f"Fashion-MNIST IDX files absent from {folder}: "
                    "sudo apt-get install dataset-fashion-mnist (or make fashion-mnist)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _fashion_or_skip()
    out = tmp_path_factory.mktemp("fahmc-logistic")
    return out, run_study(E, out, quick=True, progress=False, settings=TINY)


def test_registered():
    assert get("fahmc-logistic") is E


@pytest.mark.slow
def test_tiny_run_structure_and_budget(tiny):
    out, r = tiny
    assert set(r["runs"]) == {"K=1,T=5", "K=10,T=5"}
    assert r["groups"] == {"leapfrog": ["K=1,T=5", "K=10,T=5"], "local_steps": ["K=10,T=5"]}
    assert r["data"]["dim"] == 21 * 10 and r["data"]["client_sizes"] == [300] * 10
    for v in r["runs"].values():
        # two minibatch gradients per leapfrog step, T leapfrog steps per round
        assert v["gradients_per_client"] == [2 * 5 * (i + 1) for i in range(6)]
        assert v["step_size"] == 3e-3 and v["pilot_nll"] == {}  # one eta: nothing to tune
        assert np.asarray(v["per_run"]["ece"]).shape == (2, 6)
        np.testing.assert_allclose(v["mean"]["nll"], np.mean(v["per_run"]["nll"], axis=0))
        assert 0 <= v["final"]["ece"]["mean"] <= 1 and v["final"]["nll"]["mean"] > 0 and v["final"]["nll"]["sd"] > 0
    for png in ("metrics_vs_rounds_leapfrog.png", "metrics_vs_rounds_local_steps.png"):
        assert (out / png).stat().st_size > 0
    assert (out / "runs" / "K10_T5" / "posterior.nc").exists()
    assert r["comparison"]["leapfrog"]["nll"]["ranking_final"][0] in r["runs"]


@pytest.mark.slow
def test_longer_trajectories_mix_faster(tiny):
    _, r = tiny
    k1, k10 = r["runs"]["K=1,T=5"], r["runs"]["K=10,T=5"]
    # far above chance (0.1), and ahead of FA-LD (K = 1) at equal computation per round
    assert k10["mean"]["accuracy"][-1] > 0.6
    assert k10["mean"]["accuracy"][-1] > k1["mean"]["accuracy"][-1]


def test_metrics_are_of_the_bma_of_all_draws_so_far():
    # two draws, each right on half of the points; only their average is right on all of them
    y = np.array([0, 0, 1, 1])
    a = np.array([[0.9, 0.1], [0.45, 0.55], [0.2, 0.8], [0.55, 0.45]])
    b = np.array([[0.45, 0.55], [0.9, 0.1], [0.55, 0.45], [0.2, 0.8]])
    c = E.bma_curves(np.stack([a, b, b])[None], y, ece_bins=5)  # rounds {1}, {1, 2}, {1, 2, 3}
    assert c["accuracy"].tolist() == [[0.5, 1.0, 1.0]]  # the last half (rounds 2, 3) would give 0.5
    assert c["nll"][0, 1] == pytest.approx(evaluation.nll((a + b) / 2, y))
    assert c["brier"][0, 1] == pytest.approx(evaluation.brier((a + b) / 2, y))
    half = E.bma_curves(np.stack([a, a, b, b])[None], y, ece_bins=5, burn_in=0.5)  # round 4 averages rounds 3, 4
    assert half["accuracy"][0, 2] == 1.0 and half["accuracy"][0, 3] == 0.5
    runs = E.bma_curves(np.stack([np.stack([a, b]), np.stack([b, b])]), y, ece_bins=5)  # runs are not pooled
    assert runs["accuracy"][:, 1].tolist() == [1.0, 0.5]
    with pytest.raises(ValueError, match="bma_burn_in"):
        E.bma_curves(np.stack([a])[None], y, ece_bins=5, burn_in=1.0)


def test_top_k_minibatches_are_uniform_subsets():
    import jax
    from fedmcmc.estimators.gradients import top_k_indices
    keys = jax.random.split(jax.random.PRNGKey(1), 2000)
    idx = np.asarray(jax.vmap(lambda k: top_k_indices(k, 7, 3, 4, 10))(keys))
    assert all(len(set(row[:3])) == 3 for row in idx) and (idx[:, 3] == 0).all() and idx.max() < 7
    freq = np.bincount(idx[:, :3].ravel(), minlength=7) / 2000  # each point with probability 3/7
    se = np.sqrt(3 / 7 * 4 / 7 / 2000)
    assert np.all(np.abs(freq - 3 / 7) < 5 * se), freq


def test_missing_fashion_mnist_fails_with_the_loaders_message(tmp_path, monkeypatch):
    monkeypatch.setattr(builtin, "FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        run_study(E, tmp_path / "out", quick=True, progress=False, settings=TINY)


def test_pca_project_keeps_the_top_principal_variances():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1]) + 7.0
    split = Split(x.astype(np.float32), np.zeros(400, np.int32), x[:50].astype(np.float32),
                  np.zeros(50, np.int32), 2, "none", 0.0, 1.0, "toy", "toy", "toy")
    p = pca_project(split, 3)
    assert p.x_train.shape == (400, 3) and p.x_test.shape == (50, 3) and p.name == "toy-pca3"
    np.testing.assert_allclose(p.x_train.mean(axis=0), 0, atol=1e-4)
    top = np.sort(np.linalg.eigvalsh(np.cov(x.T, bias=True)))[::-1][:3]
    np.testing.assert_allclose(p.x_train.var(axis=0), top, rtol=1e-4)
    np.testing.assert_allclose(p.x_test, p.x_train[:50], atol=1e-4)  # same mean and axes
    with pytest.raises(ValueError, match="num_components"):
        pca_project(split, 7)
