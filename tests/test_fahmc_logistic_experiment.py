"""FA-HMC on Fashion-MNIST (Liang et al. 2024, Section 5.3): tiny settings of the reproduction,
the BMA scoring and the PCA reduction its quick setting uses."""

from pathlib import Path

import numpy as np
import pytest

from fedmcmc import predictive
from fedmcmc.data import datasets as D
from fedmcmc.experiments import fahmc_logistic as E
from fedmcmc.experiments import get

TINY = dict(train_subset=3000, test_subset=1000, pca_components=20, batch_size=50, step_size=2e-3,
            leapfrog_sweep=[1, 10], sweep_local_steps=5, local_steps_sweep=[5], sweep_leapfrog=10,
            rounds=8, gradient_budget=160, accuracy_targets=[0.6, 0.7])


def _fashion_or_skip():
    folder = Path(D.FASHION_MNIST_DIR)
    if not all(any((folder / (f + ext)).is_file() for ext in (".gz", "")) for f in D.FASHION_MNIST_FILES):
        pytest.skip(f"Fashion-MNIST IDX files absent from {folder}: "
                    "sudo apt-get install dataset-fashion-mnist (or make fashion-mnist)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    _fashion_or_skip()
    out = tmp_path_factory.mktemp("fahmc-logistic")
    return out, E.run(out, quick=True, progress=False, settings=TINY)


def test_registered():
    assert get("fahmc-logistic") is E


def test_tiny_run_structure_and_budget(tiny):
    out, r = tiny
    assert set(r["runs"]) == {"K=1,T=5", "K=10,T=5"}
    assert r["groups"] == {"leapfrog": ["K=1,T=5", "K=10,T=5"], "local_steps": ["K=10,T=5"]}
    assert r["data"]["dim"] == 21 * 10 and r["data"]["client_sizes"] == [300] * 10
    # a round costs K T + 1 gradients per client; the budget of 160 gives min(8, 160 // 6) and 160 // 51 rounds
    assert [r["runs"][n]["rounds_run"] for n in ("K=1,T=5", "K=10,T=5")] == [8, 3]
    for v in r["runs"].values():
        assert v["gradients_per_client"][-1] == v["rounds_run"] * (v["num_leapfrog"] * v["local_steps"] + 1)
        assert all(len(c) == v["rounds_run"] for c in v["curves"].values())
        assert 0 <= v["final"]["ece"] <= 1 and 0 <= v["final"]["brier"] <= 2 and v["final"]["nll"] > 0
    for png in ("metrics_vs_rounds_leapfrog.png", "metrics_vs_rounds_local_steps.png", "accuracy_vs_gradients.png"):
        assert (out / png).stat().st_size > 0
    assert (out / "runs" / "K10_T5" / "posterior.nc").exists()


def test_more_leapfrog_steps_need_fewer_rounds(tiny):
    _, r = tiny
    k1, k10 = r["runs"]["K=1,T=5"], r["runs"]["K=10,T=5"]
    # far above chance (0.1) after a few rounds, and first with the longer trajectories
    assert k10["curves"]["accuracy"][-1] > 0.7
    assert k10["rounds_to_accuracy"]["0.7"] < k1["rounds_to_accuracy"]["0.7"]
    assert k1["curves"]["accuracy"][0] < k10["curves"]["accuracy"][0]


def test_metrics_are_of_the_bma_of_the_last_half():
    # two draws, each right on half of the points; only their average is right on all of them
    y = np.array([0, 0, 1, 1])
    a = np.array([[0.9, 0.1], [0.45, 0.55], [0.2, 0.8], [0.55, 0.45]])
    b = np.array([[0.45, 0.55], [0.9, 0.1], [0.55, 0.45], [0.2, 0.8]])
    probs = np.stack([a, b, b])[None]  # [chain, round, n, K]
    c = E.bma_curves(probs, y, ece_bins=5)
    assert c["accuracy"] == [0.5, 0.5, 0.5]  # rounds {1}, {2}, {2, 3}: the window drops round 1
    two = E.bma_curves(np.stack([a, b])[None], y, ece_bins=5)
    assert two["accuracy"][1] == 0.5 and two["draw_accuracy"] == [0.5, 0.5]
    c3 = E.bma_curves(np.stack([a, a, b, b])[None], y, ece_bins=5)  # round 4 averages rounds 3, 4: b only
    assert c3["accuracy"][2] == 1.0 and c3["accuracy"][3] == 0.5
    assert c3["nll"][2] == pytest.approx(predictive.nll((a + b) / 2, y))
    assert c3["brier"][2] == pytest.approx(predictive.brier((a + b) / 2, y))


def test_missing_fashion_mnist_fails_with_the_loaders_message(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "FASHION_MNIST_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        E.run(tmp_path / "out", quick=True, progress=False, settings=TINY)


def test_pca_project_keeps_the_top_principal_variances():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6)) * np.array([5.0, 3.0, 2.0, 1.0, 0.5, 0.1]) + 7.0
    split = D.ClassificationSplit(x.astype(np.float32), np.zeros(400, np.int32), x[:50].astype(np.float32),
                                  np.zeros(50, np.int32), 2, "none", 0.0, 1.0, "toy", "toy", "toy")
    p = D.pca_project(split, 3)
    assert p.x_train.shape == (400, 3) and p.x_test.shape == (50, 3) and p.name == "toy-pca3"
    np.testing.assert_allclose(p.x_train.mean(axis=0), 0, atol=1e-4)
    top = np.sort(np.linalg.eigvalsh(np.cov(x.T, bias=True)))[::-1][:3]
    np.testing.assert_allclose(p.x_train.var(axis=0), top, rtol=1e-4)
    np.testing.assert_allclose(p.x_test, p.x_train[:50], atol=1e-4)  # same mean and axes
    with pytest.raises(ValueError, match="num_components"):
        D.pca_project(split, 7)
