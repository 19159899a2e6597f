"""Whitened models: the posterior in coordinates ``z`` with ``theta = c + L z``.

Given a centre ``c`` and a factor ``L`` (``[d, d]`` lower-triangular, or ``[d]`` for a
diagonal one), ``whitened(model, c, L)`` is the model of ``z`` with

    log p_z(x | z) = log p(x | c + L z),        log prior_z(z) = log prior(c + L z),

so that its potential is ``U_z(z) = U(c + L z)``, its gradient ``L^T grad U(c + L z)`` and its
Hessian ``L^T nabla^2 U(c + L z) L``. The density of ``z`` is ``pi(c + L z) |det L|``: the
Jacobian is a constant, dropped here, as every sampler needs the potential only up to a constant.
Draws of ``z`` are draws of ``theta`` through :meth:`Whitening.to_theta`.

Why: every sampler of this library moves every coordinate with one scalar step ``gamma``, stable
only below ``~ 2 / lambda_max`` of the potential's Hessian and mixing in ``~ lambda_max /
lambda_min`` steps. A posterior whose scales differ by orders of magnitude (features in their
own units, strongly correlated features) has a condition number of ``1e6`` or more: a step that
is stable for its narrowest direction never moves along its widest. With ``c = theta*`` the
federated mode and ``L L^T = H^{-1}``, ``H = nabla^2 U(theta*)`` (the Laplace approximation,
:func:`fedmcmc.estimators.approximation.laplace_approximation`), the Hessian of ``U_z`` at
``z* = 0`` is ``L^T H L = I``: curvature 1 in every direction, one step for all of them.
:func:`whitening` makes ``(c, L)`` from the approximation: up to its ``FULL_DIM`` parameters
``L = cholesky(H^{-1})``; beyond, the approximation is diagonal and ``L = diag(1 / sqrt(H_ii))``,
the conditional standard deviations, which equalise the scales but do not decorrelate.

Cost: each evaluation maps ``theta = c + L z`` and its gradient back, ``L^T g``: ``O(d^2)``
operations per gradient for a full factor (on top of the likelihood's ``O(n d)``), ``O(d)`` for
a diagonal one; ``c`` and ``L`` are sent once to every client.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model

__all__ = ["Whitening", "whitened", "whitening"]


class Whitening(NamedTuple):
    """The map ``theta = centre + L z`` (module docstring).

    Attributes
    ----------
    centre
        ``[d]``: ``c``, the mode theta*.
    factor
        ``[d, d]`` lower-triangular ``L`` with ``L L^T = H^{-1}``, or ``[d]``: the diagonal of
        ``L`` (the conditional standard deviations ``1 / sqrt(H_ii)``).
    """

    centre: np.ndarray
    factor: np.ndarray

    @property
    def full(self) -> bool:
        """Whether ``factor`` is a full ``[d, d]`` matrix."""
        return np.ndim(self.factor) == 2

    def to_theta(self, z) -> np.ndarray:
        """``theta = c + L z`` for ``z`` of shape ``[..., d]`` (draws), in ``z``'s float type."""
        z = np.asarray(z)
        theta = self.centre + (z @ np.transpose(self.factor) if self.full else z * self.factor)
        return theta.astype(z.dtype if np.issubdtype(z.dtype, np.floating) else np.float64)

    def to_z(self, theta) -> np.ndarray:
        """``z = L^{-1} (theta - c)`` for ``theta`` of shape ``[..., d]`` (starting points), in
        ``theta``'s float type."""
        theta = np.asarray(theta)
        x = theta - self.centre
        z = np.linalg.solve(self.factor, x[..., None])[..., 0] if self.full else x / self.factor
        return z.astype(theta.dtype if np.issubdtype(theta.dtype, np.floating) else np.float64)


def whitening(approx) -> Whitening:
    """The whitening of a Laplace approximation
    (:class:`fedmcmc.estimators.approximation.Laplace`): ``c = theta*`` and ``L = cholesky(H^{-1})``
    (full) or the conditional standard deviations (diagonal)."""
    factor = np.linalg.cholesky(approx.cov) if approx.full else np.asarray(approx.sd, np.float64)
    return Whitening(np.asarray(approx.mean, np.float64), factor)


def whitened(model: Model, centre, factor) -> Model:
    """The model of ``z``, ``theta = centre + factor z`` (module docstring): log-likelihood and
    log-prior of ``model`` at ``theta`` (the constant Jacobian ``log |det L|`` dropped), predictions
    through the map, no layout (``z`` has no blocks).

    Raises
    ------
    ValueError
        If ``centre`` is not ``[d]`` or ``factor`` neither ``[d, d]`` nor ``[d]``.
    """
    d = int(model.dim)
    c, lower = jnp.asarray(centre, jnp.float32), jnp.asarray(factor, jnp.float32)
    if c.shape != (d,) or lower.shape not in ((d, d), (d,)):
        raise ValueError(f"whitening {model.name} (d = {d}) needs a centre of shape ({d},) and a factor of shape "
                         f"({d}, {d}) or ({d},) (got {c.shape} and {lower.shape})")
    full = lower.ndim == 2
    base_ll, base_lp, base_predict = model.log_likelihood, model.log_prior, model.predict
    barrier = jax.lax.optimization_barrier

    def to_theta(z):  # L z apart (barrier): never fused with the caller's arithmetic, the same bits in every program
        return c + barrier(jnp.sum(lower * z, axis=-1) if full else lower * z)

    def log_likelihood(z, datum):
        return base_ll(to_theta(z), datum)

    def log_prior(z):
        return base_lp(to_theta(z))

    def predict(z, inputs):
        return base_predict(to_theta(z), inputs)

    return model._replace(log_likelihood=log_likelihood, log_prior=log_prior,
                          predict=None if base_predict is None else predict, layout=None,
                          name=f"{model.name}-whitened")
