"""QLSD++ (Vono et al., AISTATS 2022, Algorithm 2): SVRG control variates and memory terms.

**The anchor** is global: ``zeta_k = theta_k`` if ``k = 0 mod l``, else ``zeta_k = zeta_{k-1}``, and
``zeta_0 = theta_0`` comes with its exact gradient (every client computes ``grad U_i(theta_0)`` in
``client_init``). Each round every active client ``i in A_k`` forms

    H_i = (N_i / n_i) sum_{j in S_i} [grad U_ij(theta_k) - grad U_ij(zeta_k)] + grad U_i(zeta_k),

uploads ``Delta_i = C_i(H_i - eta_i)`` and updates its memory ``eta_i <- eta_i + alpha_i Delta_i``
(``alpha_i = 1 / (omega_i + 1)`` by default; memory terms start at zero). The server keeps
``eta = sum_i eta_i`` in step with the clients and moves

    theta_{k+1} = theta_k - gamma_k [ grad U_0(theta_k) + eta + sum_{i in A_k} w_i Delta_i ]
                  + sqrt(2 gamma_k) Z_{k+1},
    eta <- eta + sum_{i in A_k} alpha_i Delta_i,

with ``w_i = b / |A_k|`` or ``1 / p_i`` (:mod:`fedmcmc.samplers.participation`) and ``U_0 = -log prior``.
``E[H_i] = grad U_i(theta_k)`` needs ``grad U_i(zeta_k)`` at the current anchor, and a client
that was inactive when the anchor moved does not hold it. So each client stores the round of
its anchor; the current anchor's round is ``l floor(k / l)``, known from ``k``. In a round where
the anchor moves (``k = 0 mod l``) every active client refreshes at ``theta_k``, which it has; a
client whose anchor is older (*stale*) refreshes on its next active round: it computes
``grad U_i(zeta_k)`` at the anchor ``zeta_k``, which the server then attaches to the broadcast.
Every client's ``H_i`` is therefore unbiased from the first round, under any participation.

**Bits.** ``ClientInfo.bits`` is the encoded ``Delta_i``, as before. The broadcast of round
``k`` is ``theta_k`` (32 d bits), plus ``zeta_k`` (32 d bits more) when ``k`` is not a multiple of
``l`` and some client may be stale. The server's state does not know ``b``, so it does not track
clients one by one: "some client may be stale" means that since the anchor last moved, some
round had an inactive client (under full participation the anchor never travels).
``ServerInfo.broadcast_bits`` of ``server_step(k)`` is the size of round ``k``'s broadcast, the one
that round's active clients received. With full batches (``batch_size=None``) ``H_i`` is the exact
``grad U_i(theta_k)``, the anchor is not used and never travels. Nor does it when every ``p_i = 1``
(``participation.probs``): no client can miss a refresh, and the catch-up is not even compiled.

**Memory update: the paper has two.** Algorithm 2 (and Algorithm S3, LSD++) updates
``eta_i <- eta_i + alpha Delta_i`` on active clients, with no ``1 / p_i``; the analysed recursion
(supplement eqs. S43-S45) applies the partial-participation operator ``S_i(x) = 1{i in A} x / p_i``
(eq. S4) to the memory increment too:

    eta_{k+1}^(i) = eta_k^(i) + alpha S_i(C_i{G_i(theta_k, zeta_k) - eta_k^(i)})      (S45)

``memory_update="algorithm"`` (default) is the algorithm box; ``"inverse_probability"`` is S45,
with ``p_i`` from ``participation.probs`` (client and server apply the same factor, so
``eta = sum_i eta_i`` stays exact). Both leave the drift unbiased: the server adds all of
``eta`` and the active clients' corrections. Under full participation they are the same chain.

With ``memory=False``, or equivalently ``memory_rate=0`` (alpha = 0, so eta stays 0), this is
QLSD with SVRG gradients ("QLSD++ without memory", Vono et al., supplement Figure S3). LSD++
(Algorithm S3) is QLSD++ with the identity compressor, memory included (:func:`lsd_pp`).

**Cost in simulation.** A stale client's refresh is a per-client, per-chain event. Under
``vmap`` a ``lax.cond`` on it would compute the full local gradient for every client every round,
so it is a ``lax.while_loop`` that runs its body only when some client of the batch is stale
(the loop is left out under full participation, where even idle it cost a third of the
simulator's speed on a small problem). Under partial participation the dense simulator also steps
inactive clients (and discards their results), and some of them are nearly always stale, so
the simulator then pays one full local gradient per client per round; a deployment pays it
only on a stale client's active round.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.compression import identity
from fedmcmc.samplers.common import (ClientInfo, ServerInfo, float_bits, langevin_update,
                                     server_step_size)

MEMORY_UPDATES = ("algorithm", "inverse_probability")


class QLSDPPState(NamedTuple):
    """Server state.

    Attributes
    ----------
    position
        The sample ``theta_k``.
    memory
        ``eta = sum_i eta_i``, the sum of the clients' memory terms.
    anchor
        The anchor ``zeta_k`` of the next round.
    synced
        True if every client holds ``grad U_i`` at ``anchor`` (no client can be stale).
    """

    position: Any
    memory: Any
    anchor: Any
    synced: Any


class QLSDPPBroadcast(NamedTuple):
    """What the clients receive: ``theta_k`` and the anchor ``zeta_k`` (on the wire only on the
    rounds where a client may be stale, see the module docstring)."""

    position: Any
    anchor: Any


class QLSDPPClientState(NamedTuple):
    """Client state: compressor state, memory term ``eta_i``, its anchor, ``grad U_i`` there, and
    the round at which that anchor was set."""

    compressor: Any
    memory: Any
    reference: Any
    reference_grad: Any
    anchor_round: Any


def qlsd_pp(model: Model, step_size, batch_size=None, compressor=None, participation: Participation | None = None,
            refresh_every: int = 100, memory: bool = True, memory_rate=None, memory_update: str = "algorithm",
            name: str = "qlsd++") -> FederatedSampler:
    """Build QLSD++ (Vono et al., AISTATS 2022, Algorithm 2).

    Parameters
    ----------
    model
        The model; its prior is applied once, on the server.
    step_size
        gamma > 0, or a schedule ``k -> gamma_k``.
    batch_size
        Minibatch size ``n_i`` (int or one per client; None for full batches).
    compressor
        Unbiased compressor applied to ``H_i - eta_i`` (identity if None).
    participation
        Participation scheme (full if None).
    refresh_every
        ``l``: the anchor moves to ``theta_k`` when ``k = 0 mod l``.
    memory
        Use memory terms (``eta_i``); False gives QLSD with SVRG gradients.
    memory_rate
        ``alpha`` in ``[0, 1]`` (scalar or per client); default ``1 / (omega_i + 1)``.
        ``alpha = 0`` switches a client's memory off (its ``eta_i`` stays 0), so
        ``memory_rate=0`` runs the same chain as ``memory=False``.
    memory_update
        ``"algorithm"`` (default): ``eta_i += alpha_i Delta_i`` as in Algorithm 2;
        ``"inverse_probability"``: ``eta_i += (alpha_i / p_i) Delta_i`` as in eq. S45, with ``p_i``
        from ``participation.probs``.
    name
        Short name used in outputs.

    Returns
    -------
    FederatedSampler
        Broadcasts are :class:`QLSDPPBroadcast`; the server state is :class:`QLSDPPState`.
    """
    step_size = checks.step_size(step_size)
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    refresh_every = checks.positive_int("refresh_every (l)", refresh_every)
    checks.choice("memory_update", memory_update, MEMORY_UPDATES)
    sizes = gradients.resolve_batch_sizes(batch_size)
    if memory:
        alpha = (1.0 / (np.asarray(compressor.omega(model.dim), np.float64) + 1.0)
                 if memory_rate is None else np.asarray(memory_rate, np.float64))
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0) or np.any(alpha > 1):
            raise ValueError(f"memory_rate alpha must lie in [0, 1] (got {alpha.tolist()}); "
                             "0 switches the memory off, 1 / (omega + 1) is the default")
    else:
        alpha = np.zeros(())
    probs = None
    if memory_update == "inverse_probability":
        if participation.probs is None:
            raise ValueError(f"memory_update='inverse_probability' divides by p_i, and the participation scheme "
                             f"{participation.name!r} has no probabilities (Participation.probs is None)")
        probs = np.asarray(participation.probs, np.float64)
        alpha = alpha / probs  # per client if either is
    alpha = jnp.asarray(alpha, jnp.float32)
    # Full batches use the exact local gradient, not the anchor. A scheme whose clients are always
    # active (p_i = 1) has no stale client: no catch-up loop (it costs time even when idle) and no
    # anchor on the wire. (A client that fails on a refresh round over Flower then keeps its previous
    # anchor with its exact gradient until the next refresh: unbiased, with an older anchor.)
    always_active = participation.probs is not None and bool(np.all(np.asarray(participation.probs) == 1.0))
    uses_anchor = sizes is not None and not always_active

    def client_alpha(index):
        return alpha[index] if alpha.ndim else alpha

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        state = QLSDPPState(theta0, jnp.zeros_like(theta0), theta0, jnp.asarray(True))
        return state, QLSDPPBroadcast(theta0, theta0)

    def client_init(key, broadcast, client_data):
        del key
        zeta = broadcast.anchor  # zeta_0 = theta_0, with its exact gradient
        return QLSDPPClientState(compressor.init(broadcast.position, client_data.index), jnp.zeros_like(zeta),
                                 zeta, gradients.local_gradient(model, zeta, client_data), jnp.int32(0))

    def catch_up(client_state, broadcast, client_data, anchor_round):
        """A stale client's refresh at the broadcast anchor (a while loop: see the module docstring)."""
        stale = client_state.anchor_round != anchor_round

        def body(carry):
            return (broadcast.anchor, gradients.local_gradient(model, broadcast.anchor, client_data), anchor_round,
                    jnp.zeros((), bool))

        reference, reference_grad, round_, _ = jax.lax.while_loop(
            lambda carry: carry[3], body,
            (client_state.reference, client_state.reference_grad, client_state.anchor_round, stale))
        return reference, reference_grad, round_

    def client_step(key, client_state, broadcast, client_data, k):
        theta = broadcast.position
        k = jnp.asarray(k, jnp.int32)
        anchor_round = k - k % refresh_every
        reference, reference_grad, round_ = jax.lax.cond(
            k % refresh_every == 0,
            lambda: (theta, gradients.local_gradient(model, theta, client_data), anchor_round),
            lambda: (client_state.reference, client_state.reference_grad, client_state.anchor_round),
        )
        key_batch, key_comp = jax.random.split(key)
        if sizes is None:
            grad = gradients.local_gradient(model, theta, client_data)
        else:
            if uses_anchor:
                reference, reference_grad, round_ = catch_up(
                    client_state._replace(reference=reference, reference_grad=reference_grad, anchor_round=round_),
                    broadcast, client_data, anchor_round)
            xb, w = gradients.minibatch(key_batch, client_data, sizes)
            grad = (gradients.weighted_potential_grad(model, theta, xb, w)
                    - gradients.weighted_potential_grad(model, reference, xb, w) + reference_grad)
        message, comp_state, cinfo = compressor.apply(key_comp, grad - client_state.memory, client_state.compressor)
        new_memory = client_state.memory + client_alpha(client_data.index) * compressor.decode(message)
        return (QLSDPPClientState(comp_state, new_memory, reference, reference_grad, round_), message,
                ClientInfo(bits=cinfo.bits))

    def server_step(key, server_state, uploads, mask, k):
        gamma = server_step_size(step_size, k)
        deltas = jax.vmap(compressor.decode)(uploads)
        drift = server_state.memory + jnp.tensordot(participation.weights(mask), deltas, axes=1)
        position = langevin_update(key, model, server_state.position, drift, gamma)
        position = participation_lib.hold_if_empty(participation, mask, position, server_state.position)
        rates = mask.astype(jnp.float32) * jnp.broadcast_to(alpha, mask.shape)
        new_memory = server_state.memory + jnp.tensordot(rates, deltas, axes=1)
        # round k's broadcast carried the anchor iff k did not move it and some client may have been stale
        carried = (k % refresh_every != 0) & ~server_state.synced if uses_anchor else jnp.zeros((), bool)
        bits = float_bits(server_state.position) + jnp.where(carried, float_bits(server_state.anchor), 0)
        # after round k every active client holds grad U_i(zeta_k); the anchor of round k + 1:
        moves = (k + 1) % refresh_every == 0
        anchor = jnp.where(moves, position, server_state.anchor)
        synced = ~moves & (jnp.all(mask) | server_state.synced)
        new = QLSDPPState(position, new_memory, anchor, synced)
        return new, QLSDPPBroadcast(position, anchor), ServerInfo(step_size=gamma, broadcast_bits=bits)

    clients = per_client_count(sizes, compressor.omega(model.dim), alpha, probs,
                               known=(participation.num_clients,))
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients)


def lsd_pp(model: Model, step_size, batch_size=None, participation=None, refresh_every: int = 100,
           memory_rate=None, memory_update: str = "algorithm", name: str = "lsd++") -> FederatedSampler:
    """LSD++ (Vono et al., supplement Algorithm S3): QLSD++ with the identity compressor.

    Algorithm S3 keeps the memory terms: ``g_i = H_i - eta_i`` is uploaded uncompressed and
    ``eta_i <- eta_i + alpha g_i``. The default ``alpha = 1 / (omega + 1) = 1`` makes ``eta_i``
    the client's last uploaded ``H_i``. Under full participation the memory cancels,
    ``eta + sum_i (H_i - eta_i) = sum_i H_i`` (up to rounding); under partial participation it
    does not. This is :func:`qlsd_pp` with ``compressor=identity()``, the same chain bit for bit.
    """
    return qlsd_pp(model, step_size, batch_size, identity(), participation, refresh_every,
                   memory=True, memory_rate=memory_rate, memory_update=memory_update, name=name)
