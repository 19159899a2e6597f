"""QLSD++ (Vono et al., AISTATS 2022, Algorithm 2): QLSD with SVRG control variates and memory terms.

QLSD++ is QLSD (:mod:`fedmcmc.samplers.qlsd`) built from two pieces: every active client
``i in A_k`` estimates its gradient with the SVRG estimator at the global anchor ``zeta_k``
(:func:`fedmcmc.estimators.svrg.svrg`),

    H_i = (N_i / n_i) sum_{j in S_i} [grad U_ij(theta_k) - grad U_ij(zeta_k)] + grad U_i(zeta_k),

and uploads it through a memory-wrapped compressor (:func:`fedmcmc.compression.memory.with_memory`):
``Delta_i = C_i(H_i - eta_i)``, then ``eta_i <- eta_i + alpha_i Delta_i`` (``alpha_i = 1 / (omega_i + 1)``
by default; memory terms start at zero). The server keeps ``eta = sum_i eta_i`` in step with the
clients and moves

    theta_{k+1} = theta_k - gamma_k [ grad U_0(theta_k) + eta + sum_{i in A_k} w_i Delta_i ]
                  + sqrt(2 gamma_k) Z_{k+1},
    eta <- eta + sum_{i in A_k} alpha_i Delta_i,

with ``w_i = b / |A_k|`` or ``1 / p_i`` (:mod:`fedmcmc.samplers.participation`) and ``U_0 = -log prior``.
The anchor moves to ``theta_k`` when ``k = 0 mod l``; a client that missed a move catches up on
its next active round at the anchor the server attaches to the broadcast
(:mod:`fedmcmc.estimators.svrg`), so every ``H_i`` is unbiased under any participation.

**Bits.** ``ClientInfo.bits`` is the encoded ``Delta_i``. The broadcast of round ``k`` is
``theta_k`` (32 d bits), plus ``zeta_k`` (32 d bits more) when ``k`` is not a multiple of ``l`` and
some client may be stale (:func:`fedmcmc.estimators.svrg.anchor_travels`).
``ServerInfo.broadcast_bits`` of ``server_step(k)`` is the size of round ``k``'s broadcast, the one
that round's active clients received. With full batches (``batch_size=None``) ``H_i`` is the exact
``grad U_i(theta_k)``, the anchor is not used and never travels. Nor does it when every ``p_i = 1``
(``participation.probs``): no client can miss a refresh, and the catch-up is not even compiled.
(A client that fails on a refresh round over Flower then keeps its previous anchor with its exact
gradient until the next refresh: unbiased, with an older anchor.)

**A round with no active client** under a pausing scheme keeps ``theta`` (as QLSD does), while
the rest of the server state advances as in any round: ``eta`` gains nothing, the anchor still
moves on schedule (to the held ``theta``), and ``synced`` is updated.

**Memory update: the paper has two.** Algorithm 2 (and Algorithm S3, LSD++) updates
``eta_i <- eta_i + alpha Delta_i`` on active clients, with no ``1 / p_i``; the analysed recursion
(supplement eqs. S43-S45) applies the partial-participation operator ``S_i(x) = 1{i in A} x / p_i``
(eq. S4) to the memory increment too:

    eta_{k+1}^(i) = eta_k^(i) + alpha S_i(C_i{G_i(theta_k, zeta_k) - eta_k^(i)})      (S45)

``memory_update="algorithm"`` (default) is the algorithm box; ``"inverse_probability"`` is S45,
with ``p_i`` from ``participation.probs`` (the memory rate is ``alpha_i / p_i``, on the client and
on the server, so ``eta = sum_i eta_i`` stays exact). Both leave the drift unbiased: the server
adds all of ``eta`` and the active clients' corrections. Under full participation they are the
same chain.

**S45's memory rate.** With ``e = eta_i - G_i`` the memory's error, S45 maps it to
``e + alpha S_i(C_i(-e))``, whose mean square is

    E||e'||^2 <= (1 - 2 alpha + alpha^2 (omega_i + 1) / p_i) ||e||^2,

since ``E||S_i(C_i(x))||^2 <= (omega_i + 1) ||x||^2 / p_i``. It contracts, by ``1 - alpha`` as Lemma
S8 uses, when ``alpha (omega_i + 1) / p_i <= 1``. The paper's text states the condition as
``alpha (omega_i + 1) <= 1`` (Theorem 3, Lemma S8 and its eq. S53, which drops S_i's ``1 / p_i``
from the second moment) and runs ``alpha = 1 / (omega + 1)``, also with p = 0.25 (Section 4's
ResNet-20): under S45 that rate is ``1 / (p_i (omega_i + 1))`` and, for p_i < 1/2, the factor
above exceeds 1 (LSD++ at p = 1/4: ``e' = -3 e`` on a client's active rounds) and the chain
diverges. So under ``"inverse_probability"`` the default is ``alpha_i = p_i / (omega_i + 1)``, the
largest rate the corrected bound allows for each client; its rate ``alpha_i / p_i`` is then
``1 / (omega_i + 1)``, and the chain is the algorithm box's with its default ``alpha``, bit for
bit. A given ``memory_rate`` with ``alpha_i (omega_i + 1) / p_i > 1`` is refused.

With ``memory=False``, or equivalently ``memory_rate=0`` (alpha = 0, so eta stays 0), this is
QLSD with SVRG gradients ("QLSD++ without memory", Vono et al., supplement Figure S3). LSD++
(Algorithm S3) is QLSD++ with the identity compressor, memory included (:func:`lsd_pp`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.estimators.svrg import anchor_travels, next_anchor, svrg
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.compression import identity
from fedmcmc.compression.fixed_point import check_uniform, weighted_sum
from fedmcmc.compression.memory import memory_sum_update, with_memory
from fedmcmc.samplers.integrators import step_size_at
from fedmcmc.samplers.messages import ServerInfo, float_bits
from fedmcmc.samplers.qlsd import client_half, server_move

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


def memory_rates(compressor, dim: int, participation: Participation, memory: bool, memory_rate,
                 memory_update: str) -> np.ndarray:
    """The memory rate applied on an active client, float64 (scalar or per client).

    Under ``memory_update="algorithm"`` it is ``alpha_i``: ``1 / (omega_i + 1)`` by default, or
    ``memory_rate`` in ``[0, 1]``; 0 without memory. Under ``"inverse_probability"`` (eq. S45)
    it is ``alpha_i / p_i``, with ``alpha_i = p_i / (omega_i + 1)`` by default (so the rate is
    ``1 / (omega_i + 1)``), and a given ``alpha_i`` must satisfy ``alpha_i (omega_i + 1) / p_i <= 1``
    (the module docstring says why); a larger one is refused in one line.
    """
    checks.choice("memory_update", memory_update, MEMORY_UPDATES)
    omega = np.asarray(compressor.omega(dim), np.float64)
    if memory:
        alpha = 1.0 / (omega + 1.0) if memory_rate is None else np.asarray(memory_rate, np.float64)
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0) or np.any(alpha > 1):
            raise ValueError(f"memory_rate alpha must lie in [0, 1] (got {alpha.tolist()}); "
                             "0 switches the memory off, 1 / (omega + 1) is the default")
    else:
        alpha = np.zeros(())
    if memory_update == "inverse_probability":
        if participation.probs is None:
            raise ValueError(f"memory_update='inverse_probability' divides by p_i, and the participation scheme "
                             f"{participation.name!r} has no probabilities (Participation.probs is None)")
        probs = np.asarray(participation.probs, np.float64)
        if not memory or memory_rate is None:  # alpha_i = p_i / (omega_i + 1): the rate alpha_i / p_i, exactly
            return alpha
        bound = probs / (omega + 1.0)
        if np.any(alpha > bound * (1 + 1e-12)):
            raise ValueError(f"memory_rate alpha = {alpha.tolist()} breaks eq. S45's contraction "
                             f"alpha (omega + 1) / p_i <= 1 (alpha <= {np.round(bound, 6).tolist()} here, omega = "
                             f"{np.round(omega, 6).tolist()}, p_i = {probs.tolist()}): the memory terms diverge; "
                             "give memory_rate <= p_i / (omega + 1), or leave it out (that default)")
        alpha = alpha / probs  # per client if either is
    return alpha


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
        ``alpha`` in ``[0, 1]`` (scalar or per client); default ``1 / (omega_i + 1)``
        (``p_i / (omega_i + 1)`` under ``memory_update="inverse_probability"``).
        ``alpha = 0`` switches a client's memory off (its ``eta_i`` stays 0), so
        ``memory_rate=0`` runs the same chain as ``memory=False``.
    memory_update
        ``"algorithm"`` (default): ``eta_i += alpha_i Delta_i`` as in Algorithm 2;
        ``"inverse_probability"``: ``eta_i += (alpha_i / p_i) Delta_i`` as in eq. S45, with ``p_i``
        from ``participation.probs``; then ``alpha_i`` defaults to ``p_i / (omega_i + 1)`` and must
        satisfy ``alpha_i (omega_i + 1) / p_i <= 1`` (module docstring).
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
    sizes = gradients.resolve_batch_sizes(batch_size)
    alpha = memory_rates(compressor, model.dim, participation, memory, memory_rate, memory_update)
    # A scheme whose clients are always active (p_i = 1) has no stale client: no catch-up loop and
    # no anchor on the wire; nor with full batches, which do not use the anchor.
    always_active = participation.probs is not None and bool(np.all(np.asarray(participation.probs) == 1.0))
    uses_anchor = sizes is not None and not always_active
    client_init, client_step = client_half(svrg(model, batch_size, refresh_every, stale_clients=not always_active),
                                           with_memory(compressor, alpha))
    rate = jnp.asarray(alpha, jnp.float32)

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        state = QLSDPPState(theta0, jnp.zeros_like(theta0), theta0, jnp.asarray(True))
        return state, QLSDPPBroadcast(theta0, theta0)

    def server_step(key, server_state, uploads, mask, k):
        gamma = step_size_at(step_size, k)
        drift = server_state.memory + weighted_sum(compressor, participation.weights(mask), uploads)
        position = server_move(key, model, participation, server_state.position, drift, mask, gamma)
        carried = anchor_travels(server_state.synced, k, refresh_every) if uses_anchor else jnp.zeros((), bool)
        bits = float_bits(server_state.position) + jnp.where(carried, float_bits(server_state.anchor), 0)
        anchor, synced = next_anchor(server_state.anchor, server_state.synced, position, mask, k, refresh_every)
        memory = memory_sum_update(server_state.memory, compressor, uploads, mask, rate)
        new = QLSDPPState(position, memory, anchor, synced)
        return new, QLSDPPBroadcast(position, anchor), ServerInfo(step_size=gamma, broadcast_bits=bits)

    probs = np.asarray(participation.probs, np.float64) if memory_update == "inverse_probability" else None
    clients = per_client_count(sizes, compressor.omega(model.dim), alpha, probs, known=(participation.num_clients,))
    if compressor.aggregate is not None:
        check_uniform(compressor, "the participation weight", participation.weights(jnp.ones((clients or 1,), bool)))
        check_uniform(compressor, "the memory rate", alpha)
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
