"""Linear regression with unknown noise: its density against scipy, its predictive noise against the
closed form, and the standardised target read back in its own units."""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedmcmc.app.inputs import MODELS
from fedmcmc.evaluation import regression
from fedmcmc.models import linear_regression_unknown_noise, with_intercept, with_target_scaling


def test_unknown_noise_density_is_the_normal_and_its_prior():
    model = linear_regression_unknown_noise(3, prior_scale=2.0, noise_prior_scale=0.5)
    assert model.dim == 4
    rng = np.random.default_rng(0)
    for _ in range(3):
        theta, x, y = rng.normal(size=4), rng.normal(size=3), rng.normal(3.0, 2.0)
        got = float(model.log_likelihood(jnp.asarray(theta), (jnp.asarray(x), y)))
        assert got == pytest.approx(stats.norm.logpdf(y, x @ theta[:3], np.exp(theta[3])), rel=1e-5)
    a, b = rng.normal(size=4), rng.normal(size=4)  # the prior up to a constant: its differences

    def prior(t):
        return stats.norm.logpdf(t[:3], 0, 2.0).sum() + stats.norm.logpdf(t[3], 0, 0.5)

    assert float(model.log_prior(jnp.asarray(a)) - model.log_prior(jnp.asarray(b))) == pytest.approx(
        prior(a) - prior(b), rel=1e-5)
    with pytest.raises(ValueError, match="must be > 0"):
        linear_regression_unknown_noise(3, noise_prior_scale=0.0)


def test_predictive_sd_of_a_fixed_theta_is_sigma_in_the_targets_units():
    """One draw: the predictive is N(mean, sigma^2); read back in the target's units (mean m, scale
    s): N(m + s mean, (s sigma)^2), its log-density that of y' minus log s."""
    model = with_intercept(linear_regression_unknown_noise(3))
    theta = np.array([[[0.5, 1.0, -2.0, 0.5, np.log(0.3)]]], np.float32)
    x = np.random.default_rng(1).normal(size=(6, 3)).astype(np.float32)
    mu, var = regression.predictive_draws(model, theta, x)
    np.testing.assert_allclose(var, 0.3**2, rtol=1e-5)
    np.testing.assert_allclose(mu[0], 0.5 + x @ np.array([1.0, -2.0, 0.5]), rtol=1e-5, atol=1e-5)
    m, s = 120.0, 20.0
    original = with_target_scaling(model, m, s)
    mu_y, var_y = regression.predictive_draws(original, theta, x)
    np.testing.assert_allclose(var_y, (s * 0.3) ** 2, rtol=1e-4)
    np.testing.assert_allclose(mu_y, m + s * mu, rtol=1e-5)
    pred = regression.predictive_interval(original, theta, x, level=0.9)
    np.testing.assert_allclose(pred.upper - pred.mean, stats.norm.ppf(0.95) * s * 0.3, rtol=1e-4)
    y = 130.0
    got = float(original.log_likelihood(jnp.asarray(theta[0, 0]), (jnp.asarray(x[0]), y)))
    assert got == pytest.approx(stats.norm.logpdf(y, mu_y[0, 0], s * 0.3), rel=1e-5)


def test_the_built_in_linear_takes_unknown_noise_or_a_known_one_in_the_targets_units():
    build = MODELS["linear"][0]
    unknown = build(num_features=2)
    assert unknown.dim == 4 and unknown.name == "linear-regression-unknown-noise"
    known = build(num_features=2, noise_scale=6.0, target_scale=3.0)  # sd 6 in the data, 2 for the model
    theta, x, y = jnp.asarray([0.1, 0.2, -0.3]), jnp.asarray([1.0, 2.0]), 0.7
    assert known.dim == 3 and float(known.log_likelihood(theta, (x, y))) == pytest.approx(
        stats.norm.logpdf(y, 0.1 + 0.2 - 0.6, 2.0), rel=1e-5)
    with pytest.raises(ValueError, match='noise_scale must be "unknown" or a number > 0'):
        build(num_features=2, noise_scale="fixed")
