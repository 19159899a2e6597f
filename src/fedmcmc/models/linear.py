"""Bayesian linear regression with known noise: y = x . theta + e, e ~ N(0, noise_scale^2),
prior theta ~ N(0, prior_scale^2 I). Conjugate, so the posterior is Gaussian and exact:

    Sigma^{-1} = I / prior_scale^2 + X'X / noise_scale^2,     mu = Sigma X'y / noise_scale^2.

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
