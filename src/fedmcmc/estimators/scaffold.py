"""SCAFFOLD-style control variates (Karimireddy et al., ICML 2020) for federated local steps, as
de-biased FA-HMC uses them (Liang, Zhang, Deng, Lin and Song, 2024, Algorithm B.2).

A client running local steps on its own potential ``f^(c)`` drifts towards its own minimiser
when the clients' potentials differ. SCAFFOLD corrects every local gradient draw,

    g_c(theta)  ->  g_c(theta) - h_c + h,      h = sum_j w_j h_j,

with ``h_j = grad f^(j)(theta_s)`` client ``j``'s exact gradient at a synchronisation point
``theta_s`` (its control variate, here its *anchor*). Summed with the weights ``w_c`` the
correction is zero, so the averaged drift is unchanged; what it removes is the client drift.

Each client computes its anchor at the ``theta`` it receives and uploads it with its change
(32 bits a coordinate); the server keeps every client's last anchor (a client that misses
rounds keeps its old one) and broadcasts ``h`` with the next ``theta`` (32 bits a
coordinate). So a round's correction uses the anchors of the previous synchronisation
(``theta_{t-T}`` in Algorithm B.2), at no extra round trip. In the first round no anchor is
known and the correction is zero.

:func:`scaffold` is the piece and :func:`none` the piece that changes nothing (no state,
nothing on the wire), so that a sampler is written once for both.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax.numpy as jnp


class ControlVariates(NamedTuple):
    """Control variates of the clients' local gradients, as four pure functions.

    Attributes
    ----------
    init
        ``init(num_clients, theta0) -> (anchors, correction)``: the server's table of the
        clients' anchors (``[b, d]``) and the first broadcast correction ``h``.
    client_init
        ``client_init(theta0) -> anchor``: a client's anchor before its first upload.
    correct
        ``correct(estimate, correction, anchor) -> estimate``: the client's gradient estimator
        ``estimate(key, theta)`` with ``h - h_c`` added to every evaluation.
    refresh
        ``refresh(exact_gradient, theta) -> anchor``: the client's new anchor at the
        synchronisation point ``theta`` (what it uploads), from ``exact_gradient(theta)``.
    aggregate
        ``aggregate(anchors, uploaded, mask, weights) -> (anchors, correction)``: the server
        keeps the active clients' new anchors and forms ``h = sum_j w_j h_j``.
    """

    init: Callable
    client_init: Callable
    correct: Callable
    refresh: Callable
    aggregate: Callable


def scaffold() -> ControlVariates:
    """SCAFFOLD's control variates (module docstring)."""

    def init(num_clients, theta0):
        return jnp.zeros((num_clients,) + theta0.shape, jnp.float32), jnp.zeros_like(theta0)

    def correct(estimate, correction, anchor):
        shift = correction - anchor

        def corrected(key, theta):
            return estimate(key, theta) + shift

        return corrected

    def aggregate(anchors, uploaded, mask, weights):
        anchors = jnp.where(mask[:, None], uploaded, anchors)
        return anchors, jnp.tensordot(weights, anchors, axes=1)

    return ControlVariates(init, jnp.zeros_like, correct, lambda exact_gradient, theta: exact_gradient(theta),
                           aggregate)


def none() -> ControlVariates:
    """No control variates: the estimator as it is, ``()`` for every state and message."""
    return ControlVariates(init=lambda num_clients, theta0: ((), ()), client_init=lambda theta0: (),
                           correct=lambda estimate, correction, anchor: estimate,
                           refresh=lambda exact_gradient, theta: (),
                           aggregate=lambda anchors, uploaded, mask, weights: ((), ()))
