"""Bayesian linear regression with known noise: y = x . theta + e, e ~ N(0, noise_scale^2),
prior theta ~ N(0, prior_scale^2 I). Conjugate, so the posterior is Gaussian and exact:

    Sigma^{-1} = I / prior_scale^2 + X'X / noise_scale^2,     mu = Sigma X'y / noise_scale^2.

With the noise unknown (:func:`linear_regression_unknown_noise`) ``log sigma`` is one more
parameter, with a Gaussian prior; its posterior has no closed form.

An intercept is a column of ones in ``x`` (see :func:`fedmcmc.data.with_intercept`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.data.federated import FederatedData


def linear_regression(dim: int, noise_scale: float = 1.0, prior_scale: float = 1.0) -> Model:
    """Build the model; a datum is ``(x, y)`` with ``x`` of shape ``[dim]`` and ``y`` a float."""
    if not noise_scale > 0 or not prior_scale > 0:
        raise ValueError(f"noise_scale and prior_scale must be > 0 (got {noise_scale}, {prior_scale})")
    s2, t2 = float(noise_scale) ** 2, float(prior_scale) ** 2
    const = -0.5 * np.log(2 * np.pi * s2)

    def log_likelihood(theta, datum):
        x, y = datum
        return const - 0.5 * (y - jnp.dot(x, theta)) ** 2 / s2

    def log_prior(theta):
        return -0.5 * jnp.sum(theta**2) / t2

    def predict(theta, inputs):
        """Predictive means ``[n]``: ``x . theta``."""
        return inputs @ theta

    return Model(log_likelihood, log_prior, dim, name="linear-regression", predict=predict)


#: The name of :func:`linear_regression_unknown_noise`'s models (outputs name its last coordinate ``log_sigma``).
UNKNOWN_NOISE_NAME = "linear-regression-unknown-noise"


def linear_regression_unknown_noise(dim: int, prior_scale: float = 1.0, noise_prior_scale: float = 1.0) -> Model:
    """Bayesian linear regression whose Gaussian noise scale is a parameter too.

    ``theta = [b, log sigma]`` of dimension ``dim + 1``; a datum is ``(x, y)`` with ``x`` of shape
    ``[dim]``. The likelihood and the prior (up to a constant) are

        log p(y | x, theta) = -log(2 pi) / 2 - log sigma - (y - x . b)^2 / (2 sigma^2),
        b ~ N(0, prior_scale^2 I),    log sigma ~ N(0, noise_prior_scale^2),

    so with ``noise_prior_scale = 1`` sigma lies within a factor ``e^2`` of 1 with probability
    0.95: weakly informative for a standardised target, in the target's own units otherwise.
    ``predict`` gives the means ``x . b``.
    """
    if not prior_scale > 0 or not noise_prior_scale > 0:
        raise ValueError(f"prior_scale and noise_prior_scale must be > 0 (got {prior_scale}, {noise_prior_scale})")
    t2, u2 = float(prior_scale) ** 2, float(noise_prior_scale) ** 2
    const = -0.5 * np.log(2 * np.pi)

    def log_likelihood(theta, datum):
        x, y = datum
        log_sigma = theta[-1]
        return const - log_sigma - 0.5 * ((y - jnp.dot(x, theta[:-1])) * jnp.exp(-log_sigma)) ** 2

    def log_prior(theta):
        return -0.5 * jnp.sum(theta[:-1] ** 2) / t2 - 0.5 * theta[-1] ** 2 / u2

    def predict(theta, inputs):
        """Predictive means ``[n]``: ``x . b``."""
        return inputs @ theta[:-1]

    return Model(log_likelihood, log_prior, dim + 1, name=UNKNOWN_NOISE_NAME, predict=predict)


class LinearPosterior(NamedTuple):
    """The exact posterior N(mean, cov) of :func:`linear_regression` (float64)."""

    mean: np.ndarray
    cov: np.ndarray


def linear_regression_posterior(data: FederatedData, noise_scale: float = 1.0,
                                prior_scale: float = 1.0) -> LinearPosterior:
    """Exact posterior of :func:`linear_regression` given all clients' data."""
    xs, ys = zip(*(data.unpadded(i) for i in range(data.num_clients)))
    x = np.concatenate(xs).astype(np.float64)
    y = np.concatenate(ys).astype(np.float64)
    precision = np.eye(x.shape[1]) / prior_scale**2 + x.T @ x / noise_scale**2
    cov = np.linalg.inv(precision)
    return LinearPosterior(cov @ (x.T @ y) / noise_scale**2, cov)
