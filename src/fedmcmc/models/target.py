"""A regression model of a standardised target, read in the target's own units.

A model fitted to ``y' = (y - mean) / scale`` gives, by the change of variables,

    log p(y | x, theta) = log p'((y - mean) / scale | x, theta) - log scale,
    E[y | x, theta] = mean + scale E[y' | x, theta],

so its log-likelihoods, predictive means and noise (read from the curvature in ``y``,
:mod:`fedmcmc.evaluation.regression`: ``sigma = scale sigma'``) are in the target's units.
"""

from __future__ import annotations

import math

from fedmcmc.core.base import Model


def with_target_scaling(model: Model, mean: float, scale: float) -> Model:
    """``model`` (of the standardised target ``(y - mean) / scale``) as a model of ``y`` itself
    (module docstring); the prior and ``theta`` are unchanged."""
    m, s = float(mean), float(scale)
    if not (s > 0 and math.isfinite(s) and math.isfinite(m)):
        raise ValueError(f"the target's scaling needs a finite mean and a scale > 0 (got {mean!r}, {scale!r})")
    base_ll, base_predict, log_s = model.log_likelihood, model.predict, math.log(s)

    def log_likelihood(theta, datum):
        x, y = datum
        return base_ll(theta, (x, (y - m) / s)) - log_s

    def predict(theta, inputs):
        return m + s * base_predict(theta, inputs)

    return model._replace(log_likelihood=log_likelihood, predict=None if base_predict is None else predict)
