"""SVRG control variates at a periodically refreshed global anchor (Johnson and Zhang, 2013), as
used by QLSD++ (Vono et al., AISTATS 2022, Algorithm 2): a gradient estimator that wraps the
minibatch estimator.

**The anchor** is global: ``zeta_k = theta_k`` if ``k = 0 mod l``, else ``zeta_k = zeta_{k-1}``,
and ``zeta_0 = theta_0`` comes with its exact gradient (every client computes
``grad U_i(theta_0)`` in ``init``). In round ``k`` client ``i`` estimates

    H_i(theta_k) = (N_i / n_i) sum_{j in S_i} [grad U_ij(theta_k) - grad U_ij(zeta_k)] + grad U_i(zeta_k),

on one minibatch ``S_i`` of ``n_i`` of its ``N_i`` points (the exact ``grad U_i(theta_k)`` with
full batches, ``batch_size=None``, where the anchor is not used).

**Stale clients.** ``E[H_i] = grad U_i(theta_k)`` needs ``grad U_i(zeta_k)`` at the current anchor,
and a client that was inactive when the anchor moved does not hold it. So each client stores
the round of its anchor; the current anchor's round is ``l floor(k / l)``, known from ``k``. In a
round where the anchor moves (``k = 0 mod l``) every active client refreshes at ``theta_k``,
which it has; a client whose anchor is older (*stale*) refreshes on its next active round: it
computes ``grad U_i(zeta_k)`` at the anchor ``zeta_k``, which the server then attaches to the
broadcast (:func:`anchor_travels`, :func:`next_anchor`). Every client's ``H_i`` is therefore
unbiased from the first round, under any participation.

**Cost in simulation.** A stale client's refresh is a per-client, per-chain event. Under
``vmap`` a ``lax.cond`` on it would compute the full local gradient for every client every round,
so it is a ``lax.while_loop`` that runs its body only when some client of the batch is stale
(it is left out when no client can be stale, ``stale_clients=False``: idle, it cost a third of
the simulator's speed on a small problem). Under partial participation the dense simulator also
steps inactive clients (and discards their results), and some of them are nearly always stale,
so the simulator then pays one full local gradient per client per round; a deployment pays it
only on a stale client's active round.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core.base import Model
from fedmcmc.estimators.gradients import (GradientEstimator, gradient_difference, local_gradient, on_minibatch,
                                          resolve_batch_sizes)


class SVRGState(NamedTuple):
    """A client's control variate: the anchor ``zeta`` it holds, ``grad U_i(zeta)``, and the
    round at which that anchor was set."""

    reference: Any
    reference_grad: Any
    anchor_round: Any


def svrg(model: Model, batch_size, refresh_every: int, stale_clients: bool = True) -> GradientEstimator:
    """The SVRG estimator ``H_i`` of the module docstring.

    Parameters
    ----------
    model
        The model whose per-point potentials ``U_ij`` are differentiated.
    batch_size
        ``n_i`` (int or one per client); None for the exact local gradient.
    refresh_every
        ``l``: the anchor moves to ``theta_k`` when ``k = 0 mod l``.
    stale_clients
        Whether a client can miss a refresh (some ``p_i < 1``); if not, the catch-up loop is
        not compiled.

    Returns
    -------
    GradientEstimator
        ``init`` reads ``zeta_0 = broadcast.anchor``; ``estimate`` reads ``theta_k =
        broadcast.position`` and, for a stale client, ``zeta_k = broadcast.anchor``.
    """
    sizes = resolve_batch_sizes(batch_size)
    catch_up = stale_clients and sizes is not None
    on_batch = None if sizes is None else on_minibatch(sizes, partial(gradient_difference, model), model.dim)

    def init(broadcast, client_data):
        zeta = broadcast.anchor  # zeta_0 = theta_0, with its exact gradient
        return SVRGState(zeta, local_gradient(model, zeta, client_data), jnp.int32(0))

    def refresh_if_stale(state, anchor, client_data, anchor_round):
        """A stale client's refresh at the broadcast anchor (a while loop: see the module docstring)."""
        def body(carry):
            return anchor, local_gradient(model, anchor, client_data), anchor_round, jnp.zeros((), bool)

        *state, _ = jax.lax.while_loop(lambda carry: carry[3], body,
                                       (*state, state.anchor_round != anchor_round))
        return SVRGState(*state)

    def estimate(key, state, broadcast, client_data, k):
        theta = broadcast.position
        k = jnp.asarray(k, jnp.int32)
        anchor_round = k - k % refresh_every
        state = jax.lax.cond(
            k % refresh_every == 0,
            lambda: SVRGState(theta, local_gradient(model, theta, client_data), anchor_round),
            lambda: state,
        )
        if sizes is None:
            return local_gradient(model, theta, client_data), state
        if catch_up:
            state = refresh_if_stale(state, broadcast.anchor, client_data, anchor_round)
        return on_batch(key, client_data, theta, state.reference) + state.reference_grad, state

    return GradientEstimator(init, estimate)


def anchor_travels(synced, k, refresh_every: int):
    """Whether round ``k``'s broadcast carries the anchor: ``k`` did not move it and some client
    may be stale (``synced`` false)."""
    return (k % refresh_every != 0) & ~synced


def next_anchor(anchor, synced, position, mask, k, refresh_every: int):
    """The server's anchor after round ``k``: ``(zeta_{k+1}, synced)``.

    ``zeta_{k+1} = theta_{k+1}`` (``position``) if ``k + 1 = 0 mod l``, else ``anchor``;
    ``synced`` is true if every client holds ``grad U_i(zeta_{k+1})``: the anchor did not move,
    and every client was active in round ``k`` or already held it. The server does not track
    clients one by one (it does not know their number), so one inactive client since the
    anchor moved makes every later round of the period carry it.
    """
    moves = (k + 1) % refresh_every == 0
    return jnp.where(moves, position, anchor), ~moves & (jnp.all(mask) | synced)
