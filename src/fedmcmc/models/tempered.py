"""Tempered posteriors pi_T(theta) ∝ pi(theta)^(1/T) (cold posteriors for T < 1).

Both the per-datum log-likelihoods and the log-prior are divided by ``T``, so every client's
potential and the server's prior term are scaled alike and the samplers need no change.
Predictions (``predict``) are those of the untempered model.
"""

from __future__ import annotations

import math

from fedmcmc.core.base import Model


def tempered(model: Model, temperature: float) -> Model:
    """The model whose ``log_likelihood`` and ``log_prior`` are those of ``model`` divided by
    ``temperature`` (``T > 0``). ``T = 1`` returns ``model`` itself."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise ValueError(f"temperature must be a positive number (got {temperature!r})") from None
    if not (t > 0 and math.isfinite(t)):
        raise ValueError(f"temperature must be > 0 and finite (got {temperature!r})")
    if t == 1.0:
        return model
    base_ll, base_lp = model.log_likelihood, model.log_prior

    def log_likelihood(theta, datum):
        return base_ll(theta, datum) / t

    def log_prior(theta):
        return base_lp(theta) / t

    return model._replace(log_likelihood=log_likelihood, log_prior=log_prior, name=f"{model.name}-T{t:g}")
