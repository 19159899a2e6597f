"""The Laplace approximation of the posterior at the federated mode, as federated rounds.

With ``U(theta) = -log prior(theta) - sum_c sum_j log p(x_cj | theta)`` and its mode ``theta*``
(:func:`fedmcmc.estimators.gradients.find_mode`, federated Newton or L-BFGS), the Laplace approximation is

    pi(theta) ~ N(theta*, H^{-1}),      H = nabla^2 U(theta*) = H_0 + sum_c H_c,

``H_0`` the prior's Hessian (the server's) and ``H_c`` client ``c``'s, which it computes from its
own rows and uploads once: one round after the mode (the server broadcasts ``theta*``, ``32 d``
bits to each client; each client returns the upper triangle of ``H_c``, ``32 d (d + 1) / 2``
bits). Up to :data:`FULL_DIM` parameters the full covariance ``H^{-1}`` is formed; beyond, each
client uploads ``diag H_c`` (``32 d`` bits) and the approximation is diagonal, ``1 / H_ii``: the
*conditional* variances, a lower bound on the marginal ones when the coordinates are
correlated (:class:`Laplace` says which it holds).

What it is for: a yardstick that every run already has the parts of (the run's mode, the
curvature there), against which the posterior check compares the draws
(:mod:`fedmcmc.evaluation.posterior_check`), and dispersed starting points for the chains
(:func:`dispersed_starts`). It is a sensible yardstick for the generalised linear models of
this library (log-concave, near-Gaussian posteriors with a few hundred points per parameter)
and not for neural networks, whose posteriors are multimodal.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.estimators.gradients import FULL_HESSIAN_DIM, ModeResult, _summed

#: Up to this many parameters the approximation has a full covariance; beyond, a diagonal one.
FULL_DIM = FULL_HESSIAN_DIM


class Laplace(NamedTuple):
    """``N(mean, cov)`` at the federated mode, and what it cost beyond the mode.

    Attributes
    ----------
    mean
        ``[d]``: the mode theta*.
    sd
        ``[d]``: marginal standard deviations ``sqrt(diag H^{-1})`` (full), or the conditional
        ones ``1 / sqrt(H_ii)`` (diagonal).
    cov
        ``[d, d]``: ``H^{-1}`` (full), else None.
    full
        Whether ``sd`` are the marginal standard deviations of a full covariance.
    rounds, bits
        One round; its bits up and down over all clients.
    """

    mean: np.ndarray
    sd: np.ndarray
    cov: np.ndarray | None
    full: bool
    rounds: int
    bits: int


class NotPositiveDefinite(ValueError):
    """The Hessian of the potential at the mode is not positive definite (no Laplace approximation)."""


def laplace_approximation(model: Model, data, mode: ModeResult, full_dim: int = FULL_DIM) -> Laplace:
    """The Laplace approximation at ``mode`` (module docstring), full up to ``full_dim`` parameters.

    Raises :class:`NotPositiveDefinite` (a one-line ValueError) when ``H`` is not finite and
    positive definite there: the potential is flat or concave in some direction at the point
    found, which is then not a mode (an improper posterior, or a search that stopped early).
    """
    from fedmcmc.estimators.federation import federation, hessian_diagonal

    fed = federation(model, data)
    d, b = int(model.dim), fed.num_clients
    theta = np.asarray(mode.theta, np.float32)
    full = d <= full_dim
    if full:
        prior = np.asarray(jax.jit(jax.hessian(model.log_prior))(theta), np.float64)
        h = _summed(fed.ask("hessian", theta), -prior)
        h = 0.5 * (h + h.T)
        eig = np.linalg.eigvalsh(h) if np.all(np.isfinite(h)) else np.array([np.nan])
        if not np.all(np.isfinite(eig)) or eig.min() <= 0:
            raise NotPositiveDefinite(f"the potential's Hessian at the mode is not positive definite (smallest "
                                      f"eigenvalue {eig.min():.3g}): the point found is not a strict mode")
        cov = np.linalg.inv(h)
        sd, upload = np.sqrt(np.diag(cov)), d * (d + 1) // 2
    else:
        prior = np.asarray(jax.jit(lambda t: hessian_diagonal(model.log_prior, t))(theta), np.float64)
        h = _summed(fed.ask("hessian_diag", theta), -prior)
        if not np.all(np.isfinite(h)) or h.min() <= 0:
            raise NotPositiveDefinite("the potential's curvature at the mode is not positive in every coordinate: "
                                      "the point found is not a strict mode")
        cov, sd, upload = None, 1.0 / np.sqrt(h), d
    bits = b * 32 * (d + upload)
    return Laplace(np.asarray(theta, np.float64), sd, cov, full, 1, bits)


def dispersed_starts(key, approx: Laplace, num_chains: int, inflation: float = 2.0) -> np.ndarray:
    """``[num_chains, d]`` starting points drawn from the approximation with its standard
    deviations multiplied by ``inflation``: over-dispersed relative to the posterior, so that
    chains that never leave their start disagree and R-hat sees it."""
    z = np.asarray(jax.random.normal(key, (num_chains, approx.mean.shape[0]), jnp.float32), np.float64)
    if approx.full:
        z = z @ np.linalg.cholesky(approx.cov).T
    else:
        z = z * approx.sd
    return (approx.mean + inflation * z).astype(np.float32)
