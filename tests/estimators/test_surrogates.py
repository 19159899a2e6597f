"""CG-DSGLD's Gaussian surrogates on a model that is not Gaussian, and their check."""

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc
from fedmcmc.data import from_clients
from fedmcmc.estimators import surrogates

PRIOR_SCALE = 100.0


def noise_regression(num_features):
    """Linear regression with unknown noise: ``theta = [intercept, slopes, log sigma]``."""

    def log_likelihood(theta, datum):
        x, y = datum
        return -0.5 * ((y - theta[0] - jnp.dot(x, theta[1:-1])) / jnp.exp(theta[-1])) ** 2 - theta[-1]

    def log_prior(theta):
        return -0.5 * jnp.sum(theta**2) / PRIOR_SCALE**2

    return fedmcmc.Model(log_likelihood, log_prior, num_features + 2, "noise-regression")


def sites(num_sites=4, n=240, seed=0):
    """Features and a response in units of their own (response about 150, noise 20), split into
    sites by sorting on the response."""
    rng = np.random.default_rng(seed)
    x = rng.normal([50.0, 2.0, 120.0], [10.0, 1.0, 15.0], size=(n, 3))
    y = 150.0 + (x - [50.0, 2.0, 120.0]) @ np.array([1.5, -8.0, 0.6]) + rng.normal(0.0, 20.0, n)
    order = np.argsort(y)
    return [(x[i], y[i]) for i in np.array_split(order, num_sites)]


def direct_laplace(x, y, share):
    """The mode of ``share log p(theta) + sum log p(y | x, theta)`` by Newton's method in float64
    from the least-squares fit, and the negative Hessian there."""
    x1, n = np.column_stack([np.ones(len(y)), x]), len(y)
    beta = np.linalg.lstsq(x1, y, rcond=None)[0]
    theta = np.append(beta, np.log(np.std(y - x1 @ beta)))
    for _ in range(100):
        r, e = y - x1 @ theta[:-1], np.exp(-2 * theta[-1])
        grad = np.append(e * x1.T @ r, e * r @ r - n) - share * theta / PRIOR_SCALE**2
        hess = np.block([[e * x1.T @ x1, 2 * e * (x1.T @ r)[:, None]],
                         [2 * e * (x1.T @ r)[None, :], np.array([[2 * e * r @ r]])]])
        hess += share * np.eye(len(theta)) / PRIOR_SCALE**2
        theta = theta + np.linalg.solve(hess, grad)
    return theta, hess


@pytest.mark.slow
def test_laplace_finds_each_sites_mode_from_zero_on_a_regression_with_unknown_noise():
    """From theta = 0 (sigma = 1, residuals about 150) the local log-density is not concave: its
    negative Hessian has a negative eigenvalue. The Laplace surrogate still reaches each site's
    mode and its curvature there."""
    parts = sites()
    data, model, share = from_clients(parts), noise_regression(3), 0.25
    fit = surrogates.laplace()
    for i, (x, y) in enumerate(parts):
        q = fit(None, model, data.client(i), jnp.zeros(model.dim), share)
        surrogates.check(q.precision, q.shift, i)
        mode, precision = direct_laplace(x.astype(np.float32).astype(np.float64),
                                         y.astype(np.float32).astype(np.float64), share)
        np.testing.assert_allclose(q.mean(), mode, rtol=1e-3, atol=1e-3 * np.abs(mode).max())
        np.testing.assert_allclose(q.precision, precision, rtol=2e-3, atol=1e-3 * np.abs(precision).max())


@pytest.mark.parametrize("precision, shift, fragment", [
    (np.diag([1.0, np.nan]), np.zeros(2), "is not finite"),
    (np.array([[1.0, 2.0], [2.0, 1.0]]), np.zeros(2), "not positive definite (smallest eigenvalue -1)"),
    (np.array([[1.0, 0.5], [0.0, 1.0]]), np.zeros(2), "not symmetric"),
    (np.array([1.0, 0.0]), np.ones(2), "precision that is not positive"),
])
def test_a_surrogate_that_is_not_a_proper_gaussian_names_its_shard(precision, shift, fragment):
    with pytest.raises(ValueError, match="shard 2's Gaussian surrogate") as err:
        surrogates.check(precision[None], shift[None], 2)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    surrogates.check(np.eye(2)[None], np.ones((1, 2)), 2)  # a proper one passes
