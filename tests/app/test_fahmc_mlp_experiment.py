"""FA-HMC with a two-hidden-layer MLP on Fashion-MNIST (Liang et al. 2024, Section 5.4), tiny settings."""

import pytest

from fedmcmc.app.studies import fahmc_mlp as E
from fedmcmc.app.studies import get
from fedmcmc.app.studies.runner import run_study
from test_fahmc_logistic_experiment import _fashion_or_skip

pytestmark = pytest.mark.slow


def test_fahmc_mlp_tiny_run(tmp_path):
    _fashion_or_skip()
    r = run_study(E, tmp_path, quick=True, progress=False,
              settings=dict(train_subset=1000, test_subset=300, pca_components=10, batch_size=20, hidden=[8, 8],
                            step_sizes=[3e-2], leapfrog_sweep=[4], sweep_local_steps=4, local_steps_sweep=[4],
                            sweep_leapfrog=4, rounds=3))
    assert get("fahmc-mlp") is E
    v = r["runs"]["K=4,T=4"]
    assert r["data"]["dim"] == 11 * 8 + 9 * 8 + 9 * 10 and r["data"]["model"] == "mlp-10-8-8-10-relu"
    assert v["gradients_per_client"] == [8, 16, 24]
    # started at a He/Glorot draw, not at 0 (a saddle of a ReLU network): far above chance (0.1) after 3 rounds
    assert v["mean"]["accuracy"][-1] > 0.3 and v["mean"]["nll"][-1] < v["mean"]["nll"][0]
    assert (tmp_path / "metrics_vs_rounds_leapfrog.png").stat().st_size > 0
