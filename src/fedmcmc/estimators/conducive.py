"""Conducive gradients (El Mekkaoui, Mesquita, Blomstedt and Kaski, UAI 2021, eq. 5-7): a wrapper
that adds to shard ``s``'s gradient estimate ``v_s`` the term

    alpha g_s(theta),     g_s(theta) = grad log q(theta) - (1 / f_s) grad log q_s(theta),     q = prod_s q_s,

with ``q_s`` a Gaussian surrogate of the shard's density (:mod:`fedmcmc.estimators.surrogates`)
and ``f_s`` its visiting probability (the law it gives: :mod:`fedmcmc.samplers.dsgld`). In
natural form (``grad log q_s = e_s - L_s theta``) ``g_s`` is affine, ``g_s(theta) = offset -
matrix theta`` with ``matrix = L - L_s / f_s`` and ``offset = e - e_s / f_s``, stored once per
shard: a local step costs one matrix-vector product more.

The surrogates reach the shards by a setup exchange (:class:`Conducive`): every shard fits
``q_s`` and uploads it, the server multiplies them and sends ``q`` back, once, each way
:func:`fedmcmc.estimators.surrogates.surrogate_bits` (a full precision travels as its upper
triangle, :func:`fedmcmc.estimators.surrogates.pack`).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.estimators import surrogates as surrogates_lib


class ConduciveTerm(NamedTuple):
    """A shard's conducive gradient in closed form, ``g_s(theta) = offset - matrix theta``."""

    matrix: Any
    offset: Any


class ConduciveState(NamedTuple):
    """A shard's state: its probability ``f_s``, its own surrogate ``q_s``, and its conducive
    term once the setup exchange has brought ``q``."""

    share: Any
    surrogate: Any
    term: ConduciveTerm


def conducive_term(q: surrogates_lib.GaussianSurrogate, q_s: surrogates_lib.GaussianSurrogate, f_s) -> ConduciveTerm:
    """``g_s(theta) = grad log q(theta) - (1 / f_s) grad log q_s(theta)`` as ``offset - matrix theta``."""
    return ConduciveTerm(q.precision - q_s.precision / f_s, q.shift - q_s.shift / f_s)


def conducive_gradient(estimate: Callable, term: ConduciveTerm, alpha) -> Callable:
    """``estimate(key, theta) + alpha g_s(theta)``: the shard's estimator ``estimate`` (of the
    gradient of the log-posterior) with the conducive gradient ``term`` added."""

    def corrected(key, theta):
        return estimate(key, theta) + alpha * (term.offset - surrogates_lib.matvec(term.matrix, theta))

    return corrected


class Conducive(NamedTuple):
    """Conducive gradients for a shard-visiting sampler: the setup exchange and the wrapper.

    Attributes
    ----------
    fit
        ``fit(key, model, client_data, theta0, share) -> GaussianSurrogate`` (from
        :mod:`fedmcmc.estimators.surrogates`).
    alpha
        The scale of the conducive gradient, ``> 0`` (float32).
    likelihood_only
        Fit ``q_s`` to ``p(x_s | theta)`` (share 0) instead of ``p(theta)^{f_s} p(x_s | theta)``.
    anchor
        Where every chain's shards fit their surrogates (the federated mode: a Taylor surrogate
        is then exact there, and all chains share one ``q``), or None: at each chain's start.
    """

    fit: Callable
    alpha: Any
    likelihood_only: bool
    anchor: Any = None

    def init(self, key, model, client_data, theta0, f_s) -> ConduciveState:
        """The shard's state before the setup exchange: zeros of the surrogate's shapes."""
        shapes = jax.eval_shape(lambda *a: self.fit(a[0], model, *a[1:]), key, client_data, theta0, f_s)
        zeros = jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), shapes)
        return ConduciveState(f_s, zeros, ConduciveTerm(zeros.precision, zeros.shift))

    def upload(self, key, model, state: ConduciveState, client_data, theta0):
        """The shard fits ``q_s`` at the anchor, else at ``theta0``: returns ``(state, message, bits)``."""
        share = jnp.zeros_like(state.share) if self.likelihood_only else state.share
        at = theta0 if self.anchor is None else jnp.asarray(self.anchor, jnp.float32)
        q_s = self.fit(key, model, client_data, at, share)
        return state._replace(surrogate=q_s), surrogates_lib.pack(q_s), _bits(q_s)

    @staticmethod
    def combine(messages):
        """The server's product ``q`` of the shards' messages (stacked): returns ``(message, bits)``."""
        q = surrogates_lib.product(jax.vmap(surrogates_lib.unpack)(messages))
        return surrogates_lib.pack(q), _bits(q)

    @staticmethod
    def receive(state: ConduciveState, message) -> ConduciveState:
        """The shard stores its conducive term once ``q`` has arrived."""
        term = conducive_term(surrogates_lib.unpack(message), state.surrogate, state.share)
        return state._replace(term=term)

    def check(self, states: ConduciveState) -> None:
        """Raise a one-line ``ValueError`` naming the first shard whose surrogate is not a proper
        Gaussian, and the fitter with its remedy (:func:`fedmcmc.estimators.surrogates.check`);
        ``states`` as NumPy arrays with leading axes chains and shards."""
        q = states.surrogate
        for shard in range(q.shift.shape[1]):
            surrogates_lib.check(np.asarray(q.precision)[:, shard], np.asarray(q.shift)[:, shard], shard, self.fit)

    def wrap(self, estimate: Callable, state: ConduciveState) -> Callable:
        """The shard's estimator with its conducive gradient (:func:`conducive_gradient`)."""
        return conducive_gradient(estimate, state.term, self.alpha)


def conducive(fit=None, alpha: float = 1.0, likelihood_only: bool = False, anchor=None) -> Conducive:
    """Conducive gradients from the surrogate fitter ``fit`` (``surrogates.taylor()``, exact for
    conjugate Gaussian models, if None), scaled by ``alpha``, fitted at ``anchor`` (each chain's
    start if None)."""
    alpha = checks.positive("alpha", alpha, "; it scales the conducive gradient")
    anchor = None if anchor is None else np.asarray(anchor, np.float32)
    return Conducive(surrogates_lib.taylor() if fit is None else fit, np.float32(alpha), bool(likelihood_only), anchor)


def _bits(q: surrogates_lib.GaussianSurrogate):
    d = q.shift.shape[-1]
    return jnp.asarray(surrogates_lib.surrogate_bits(d, "diag" if q.diagonal else "full"), jnp.int32)


class VisitCurvature(NamedTuple):
    """The extreme eigenvalues, per shard, of the Hessian of a CG-DSGLD visit's potential.

    On a visit to shard ``s`` the chain follows the gradient ``v_s + alpha g_s``
    (:mod:`fedmcmc.samplers.dsgld`), of the potential whose Hessian is

        M_s = H_0 + H_s / f_s + alpha (Lambda - Lambda_s / f_s),

    ``H_0 = -nabla^2 log p``, ``H_s = -nabla^2 sum_{x in s} log p(x | theta)``, ``Lambda_s`` the
    precision of ``q_s`` and ``Lambda = sum_s Lambda_s`` (the Hessians of the Gaussian surrogates'
    potentials are their precisions). For Taylor surrogates at ``theta`` the conducive term
    cancels the shard's own: ``M_s = nabla^2 U(theta)`` for every shard.

    Attributes
    ----------
    top, low
        ``[S]``: ``lambda_max(M_s)`` and ``lambda_min(M_s)`` (0 where it is negative only by float32
        rounding of the parts).
    rounds, bits_up, bits_down
        One exchange: the shards receive ``theta``, fit and upload ``q_s``, receive ``Lambda`` and return
        their two eigenvalues.
    """

    top: np.ndarray
    low: np.ndarray
    rounds: int
    bits_up: int
    bits_down: int


def visit_curvature(key, model, data, theta, probs, conducive: Conducive, full_dim: int | None = None,
                    max_iterations: int = 2000, tol: float = 1e-6) -> VisitCurvature:
    """:class:`VisitCurvature` of CG-DSGLD's visits at ``theta`` (the mode) with shard probabilities
    ``probs`` and the surrogates ``conducive.fit`` fits there (keys ``fold_in(key, s)``), checked as
    the setup exchange checks them (:func:`fedmcmc.estimators.surrogates.check`, naming the fitter).

    Up to ``full_dim`` parameters (:data:`fedmcmc.estimators.gradients.FULL_HESSIAN_DIM` if None)
    each shard forms ``M_s`` and takes its eigenvalues; beyond, power iterations of its own
    Hessian-vector products (no communication: the shard holds ``Lambda``; ``max_iterations``,
    ``tol``: :func:`fedmcmc.estimators.curvature.power_iteration`), the smallest from the shifted
    matrix ``lambda_max I - M_s``.
    """
    from fedmcmc.estimators.curvature import power_iteration
    from fedmcmc.estimators.gradients import FULL_HESSIAN_DIM

    full_dim = FULL_HESSIAN_DIM if full_dim is None else int(full_dim)
    theta = jnp.asarray(theta, jnp.float32)
    d, num = int(theta.shape[0]), data.num_clients
    f = np.asarray(probs, np.float64)
    shares = np.zeros_like(f) if conducive.likelihood_only else f
    alpha = float(conducive.alpha)
    fit = jax.jit(lambda k, client, share: conducive.fit(k, model, client, theta, share))
    qs = [fit(jax.random.fold_in(key, s), data.client(s), jnp.float32(shares[s])) for s in range(num)]
    for s, q_s in enumerate(qs):
        surrogates_lib.check(np.asarray(q_s.precision)[None], np.asarray(q_s.shift)[None], s, conducive.fit)

    def dense(precision):
        p = np.asarray(precision, np.float64)
        return np.diag(p) if p.ndim == 1 else 0.5 * (p + p.T)

    big = sum(dense(q_s.precision) for q_s in qs)
    prior = -np.asarray(jax.hessian(model.log_prior)(theta), np.float64)

    def likelihood(client):
        return surrogates_lib.local_log_density(model, client, 0.0)

    hessian = jax.jit(lambda client: -jax.hessian(likelihood(client))(theta))
    hvp = jax.jit(lambda client, v: -jax.jvp(jax.grad(likelihood(client)), (theta,), (v,))[1])
    eps, sizes = np.finfo(np.float32).eps, np.abs(np.linalg.eigvalsh(prior)).max() + alpha * np.abs(np.linalg.eigvalsh(big)).max()
    top, low = np.zeros(num), np.zeros(num)
    for s in range(num):
        own, conducive_part = dense(qs[s].precision) / f[s], alpha * (big - dense(qs[s].precision) / f[s])
        scale = sizes + alpha * np.abs(np.linalg.eigvalsh(own)).max()
        if d <= full_dim:
            values = np.linalg.eigvalsh(prior + np.asarray(hessian(data.client(s)), np.float64) / f[s] + conducive_part)
            top[s], low[s] = values[-1], values[0]
            scale += np.abs(values).max()
        else:
            client, part = data.client(s), jnp.asarray(prior + conducive_part, jnp.float32)

            def matvec(v, client=client, part=part, f_s=np.float32(f[s])):
                return hvp(client, v) / f_s + part @ v

            top[s] = power_iteration(jax.random.fold_in(key, num + s), matvec, d, max_iterations, tol)[0]
            gap = power_iteration(jax.random.fold_in(key, 2 * num + s), lambda v: top[s] * v - matvec(v), d,
                                  max_iterations, tol)[0]
            low[s] = top[s] - gap
            scale += abs(top[s])
        if -d * eps * scale < low[s] < 0:  # rounding of the cancelling parts, not curvature
            low[s] = 0.0
    bits = surrogates_lib.surrogate_bits(d, "diag" if qs[0].diagonal else "full")
    return VisitCurvature(top, low, 1, num * (bits + 64), num * (bits + 32 * d))
