"""The padding benchmark runs, and the large-model one on packed clients (figures never asserted)."""

import jax
import numpy as np

from fedmcmc.app.bench.large import gradients_alone
from fedmcmc.app.bench.padding import padding_overhead
from fedmcmc.data.synthetic import heterogeneous_gaussian
from fedmcmc.models.gaussian import gaussian_mean


def test_padding_overhead_reports_the_packed_layout():
    out = padding_overhead(chains=2, iterations=10, repeats=1)
    assert out["qlsd_identity_full_batch_chain_iterations_per_second"] > 0
    assert out["ula_pooled_chain_iterations_per_second"] > 0
    settings = out["settings"]
    assert settings["points"] == 2042 and settings["points"] <= settings["rows_stored"] < 20 * 192


def test_the_large_model_benchs_gradients_run_on_packed_clients():
    """``federation_overhead_large``'s gradients alone (SVRG minibatches gathered from the rows)."""
    run = gradients_alone(gaussian_mean(50), heterogeneous_gaussian(), 5, 3, 1e-4, 4)
    assert np.all(np.isfinite(np.asarray(run(jax.random.PRNGKey(0), np.zeros(50)))))
