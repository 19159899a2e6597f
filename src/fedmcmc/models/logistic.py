"""Bayesian logistic regression: y in {0, 1}, p(y = 1 | x, theta) = sigmoid(x . theta),
prior theta ~ N(0, prior_scale^2 I)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedmcmc.core.base import Model


def logistic_regression(dim: int, prior_scale: float = 1.0) -> Model:
    """Build the model; a datum is ``(x, y)`` with ``x`` of shape ``[dim]`` and ``y`` in {0, 1}."""
    if not prior_scale > 0:
        raise ValueError(f"prior_scale must be > 0 (got {prior_scale})")
    t2 = float(prior_scale) ** 2

    def log_likelihood(theta, datum):
        x, y = datum
        z = jnp.dot(x, theta)
        return y * z - jax.nn.softplus(z)

    def log_prior(theta):
        return -0.5 * jnp.sum(theta**2) / t2

    def predict(theta, inputs):
        """Class probabilities ``[n, 2]``: ``(1 - sigmoid(x . theta), sigmoid(x . theta))``."""
        p = jax.nn.sigmoid(inputs @ theta)
        return jnp.stack([1.0 - p, p], axis=-1)

    return Model(log_likelihood, log_prior, dim, name="logistic-regression", predict=predict)
