"""Per-record gradient clipping (record-level privacy): a model whose per-datum log-likelihood
has the same values and a gradient of norm at most ``C``.

``clipped_gradients(model, C)`` replaces ``grad_theta log p(x_j | theta)`` by

    g_j * min(1, C / ||g_j||),

by a custom JVP on the per-datum log-likelihood, so every estimator that differentiates a
weighted sum of per-datum terms (minibatch gradients of QLSD#, SGLD, DSGLD, the local steps of
FA-HMC) receives clipped per-record gradients without a change: ``jax.grad`` of
``sum_j w_j log p(x_j | theta)`` under ``vmap`` is ``sum_j w_j clip(g_j)``. The values (held-out
log-likelihoods, predictions) are the model's. Wrap a tempered model, not the other way round,
so that the bound holds for the gradient that enters the chain.

Bias: while every ``||g_j|| <= C`` nothing changes; records whose gradient is longer count for
less (the drift is that of a different, robustified likelihood), so the chain targets another
distribution than the posterior. Off by default.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedmcmc.core import checks
from fedmcmc.core.base import Model

__all__ = ["clipped_gradients"]


def clipped_gradients(model: Model, bound: float) -> Model:
    """The model with per-datum log-likelihood gradients clipped to norm ``bound`` (see the
    module docstring).

    Raises
    ------
    ValueError
        If ``bound`` is not a finite positive number.
    """
    bound = checks.positive("record clipping bound", bound,
                            "; it is the largest norm of one record's log-likelihood gradient")
    base = model.log_likelihood
    limit = bound * checks.SAFETY  # float32 rounding stays under the bound

    @jax.custom_jvp
    def log_likelihood(theta, datum):
        return base(theta, datum)

    @log_likelihood.defjvp
    def _jvp(primals, tangents):
        theta, datum = primals
        value, grad = jax.value_and_grad(base)(theta, datum)
        norm = jnp.linalg.norm(grad)
        grad = grad * jnp.minimum(1.0, limit / jnp.where(norm > 0, norm, 1.0))
        return value, jnp.vdot(grad, tangents[0]).astype(value.dtype)

    return model._replace(log_likelihood=log_likelihood, name=f"{model.name}-clip{bound:g}")
