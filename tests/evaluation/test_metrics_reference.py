"""Metrics (W1/ME, W2, R_eps) against independent computations, and the NUTS reference
against closed-form posteriors."""

import numpy as np
import pytest
from scipy import stats

from fedmcmc.evaluation import distances as metrics, reference
from fedmcmc.data.synthetic import heterogeneous_gaussian, logistic_regression_data
from fedmcmc.models import gaussian_mean, gaussian_mean_posterior, logistic_regression


def test_wasserstein1_matches_scipy_on_unequal_sizes():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((57, 3)), rng.gamma(2.0, size=(91, 3))
    ours = metrics.wasserstein1(x, y)
    for j in range(3):
        assert ours[j] == pytest.approx(stats.wasserstein_distance(x[:, j], y[:, j]), rel=1e-12)


def test_marginal_error_is_the_mean_of_coordinate_w1_and_pools_chains():
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4, 50, 2)), 0.5 + rng.standard_normal((300, 2))
    expected = np.mean([stats.wasserstein_distance(x[..., j].ravel(), y[:, j]) for j in range(2)])
    assert metrics.marginal_error(x, y) == pytest.approx(expected, rel=1e-12)
    assert metrics.marginal_error(y, y) == 0.0


def test_w2_gaussian_closed_forms():
    # isotropic: W2^2 = ||m1 - m2||^2 + d (s1 - s2)^2
    d = 4
    assert metrics.w2_gaussian(np.ones(d), 4.0, np.zeros(d), 1.0) ** 2 == pytest.approx(d + d * 1.0)
    # commuting (diagonal) covariances: sum (sqrt a - sqrt b)^2
    a, b = np.array([1.0, 9.0]), np.array([4.0, 1.0])
    assert metrics.w2_gaussian(0.0, np.diag(a), 0.0, b) ** 2 == pytest.approx(np.sum((np.sqrt(a) - np.sqrt(b)) ** 2))
    # symmetric and zero on equal laws, for a full covariance
    rng = np.random.default_rng(2)
    m = rng.standard_normal((3, 3))
    s1, s2 = m @ m.T + np.eye(3), np.diag([1.0, 2.0, 3.0])
    assert metrics.w2_gaussian(0, s1, 1, s2) == pytest.approx(metrics.w2_gaussian(1, s2, 0, s1), rel=1e-9)
    assert metrics.w2_gaussian(0, s1, 0, s1) == pytest.approx(0.0, abs=1e-6)


def test_w2_from_samples_converges_to_the_closed_form():
    rng = np.random.default_rng(3)
    x = 1.0 + 2.0 * rng.standard_normal((200_000, 2))
    assert metrics.w2_to_gaussian(x, np.zeros(2), 1.0) == pytest.approx(np.sqrt(2 + 2), rel=1e-2)


def test_rounds_to_reach():
    assert metrics.rounds_to_reach([3.0, 2.0, 0.5, 0.7, 0.1], 0.6) == 3
    assert metrics.rounds_to_reach([3.0, 2.0], 0.1) == float("inf")
    assert metrics.rounds_to_reach([3.0, 0.2], 0.5, rounds=[10, 20]) == 20


@pytest.mark.slow
def test_nuts_reference_recovers_a_gaussian_posterior(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path))
    data = heterogeneous_gaussian(seed=3, num_clients=3, dim=2, min_size=5, max_size=12)
    model = gaussian_mean(2, prior_scale=2.0)
    exact = gaussian_mean_posterior(data, prior_scale=2.0)
    ref = reference.nuts(0, model, data, num_samples=1000, num_chains=4, num_warmup=500)
    assert not ref.cached and ref.rhat < 1.01 and ref.divergences == 0
    x = ref.samples.reshape(-1, 2)
    se_mean = np.sqrt(exact.var / ref.ess)
    assert np.all(np.abs(x.mean(axis=0) - exact.mean) < 5 * se_mean)
    se_var = exact.var * np.sqrt(2 / ref.ess)
    assert np.all(np.abs(x.var(axis=0) - exact.var) < 5 * se_var)
    again = reference.nuts(0, model, data, num_samples=1000, num_chains=4, num_warmup=500)
    assert again.cached
    np.testing.assert_array_equal(again.samples, ref.samples)
    # another prior is another problem: no stale cache
    other = reference.nuts(0, gaussian_mean(2, prior_scale=0.5), data, num_samples=50, num_chains=2, num_warmup=50)
    assert not other.cached


@pytest.mark.slow
def test_nuts_reference_on_logistic_regression_agrees_with_importance_sampling(tmp_path, monkeypatch):
    """Non-Gaussian target: the NUTS mean agrees with an importance-sampling estimate built on
    independent draws (a different algorithm) within Monte-Carlo error."""
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path))
    data, _ = logistic_regression_data(seed=0, dim=3, num_points=100, num_clients=4)
    model = logistic_regression(3)
    ref = reference.nuts(1, model, data, num_samples=1500, num_chains=4, num_warmup=500)
    logp = reference.log_posterior(model, data)
    import jax
    import jax.numpy as jnp

    # self-normalised importance sampling with a wide Gaussian proposal around the NUTS mean
    x = ref.samples.reshape(-1, 3)
    m, s = x.mean(axis=0), 2.0 * x.std(axis=0)
    rng = np.random.default_rng(4)
    z = m + s * rng.standard_normal((100_000, 3))
    logw = np.asarray(jax.vmap(logp)(jnp.asarray(z, jnp.float32)), np.float64) - stats.norm.logpdf(z, m, s).sum(1)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    is_mean = w @ z
    ess_is = 1.0 / np.sum(w**2)
    se = np.sqrt(x.var(axis=0) / ref.ess + x.var(axis=0) / ess_is)
    assert np.all(np.abs(x.mean(axis=0) - is_mean) < 5 * se), (x.mean(axis=0), is_mean, se)


@pytest.mark.slow
def test_mala_reference_recovers_a_gaussian_posterior(tmp_path, monkeypatch):
    """MALA's Metropolis correction removes the Langevin bias: at a step where ULA's variance
    would be 25% too large, MALA's draws match the exact posterior."""
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path))
    data = heterogeneous_gaussian(seed=3, num_clients=3, dim=2, min_size=5, max_size=12)
    model = gaussian_mean(2, prior_scale=2.0)
    exact = gaussian_mean_posterior(data, prior_scale=2.0)
    h = 0.4 * exact.var  # ULA with this step has variance var / (1 - h / (2 var)) = 1.25 var
    ref = reference.mala(0, model, data, h, num_samples=4000, num_chains=4, num_warmup=500, thinning=5)
    assert not ref.cached and ref.rhat < 1.01 and 0.5 < ref.acceptance < 1.0
    x = ref.samples.reshape(-1, 2)
    assert np.all(np.abs(x.mean(axis=0) - exact.mean) < 5 * np.sqrt(exact.var / ref.ess))
    assert np.all(np.abs(x.var(axis=0) - exact.var) < 5 * exact.var * np.sqrt(2 / ref.ess))
    again = reference.mala(0, model, data, h, num_samples=4000, num_chains=4, num_warmup=500, thinning=5)
    assert again.cached and again.acceptance == ref.acceptance
    np.testing.assert_array_equal(again.samples, ref.samples)


def test_reference_rejects_bad_settings():
    data = heterogeneous_gaussian(seed=3, num_clients=2, dim=2, min_size=5, max_size=8)
    with pytest.raises(ValueError, match="num_samples"):
        reference.nuts(0, gaussian_mean(2), data, num_samples=0)
    with pytest.raises(ValueError, match="step_size"):
        reference.mala(0, gaussian_mean(2), data, 0.0)
