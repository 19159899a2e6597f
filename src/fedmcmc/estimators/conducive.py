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

    @staticmethod
    def check(states: ConduciveState) -> None:
        """Raise a one-line ``ValueError`` naming the first shard whose surrogate is not a proper
        Gaussian (:func:`fedmcmc.estimators.surrogates.check`); ``states`` as NumPy arrays with
        leading axes chains and shards."""
        q = states.surrogate
        for shard in range(q.shift.shape[1]):
            surrogates_lib.check(np.asarray(q.precision)[:, shard], np.asarray(q.shift)[:, shard], shard)

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
