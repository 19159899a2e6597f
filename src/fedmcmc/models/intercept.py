"""An intercept for a model whose design starts with a column of ones, without storing the ones.

:func:`linear_regression` and :func:`logistic_regression` take ``x . theta``; an intercept is a
leading input equal to 1. :func:`with_intercept` gives the same model for inputs without that
column: ``theta[0]`` is the intercept and ``theta[1:]`` the feature weights.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedmcmc.core.base import Model


def with_intercept(model: Model) -> Model:
    """``model`` for inputs ``x`` of ``dim - 1`` features: its datum ``(x, y)`` is ``model``'s
    datum ``((1, x), y)`` and ``predict(theta, inputs)`` prepends a column of ones."""
    base_ll, base_predict = model.log_likelihood, model.predict

    def log_likelihood(theta, datum):
        x, y = datum
        return base_ll(theta, (jnp.concatenate([jnp.ones(1, x.dtype), x]), y))

    def predict(theta, inputs):
        return base_predict(theta, jnp.concatenate([jnp.ones((inputs.shape[0], 1), inputs.dtype), inputs], axis=1))

    return model._replace(log_likelihood=log_likelihood, predict=None if base_predict is None else predict)
