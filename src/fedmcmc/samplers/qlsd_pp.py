"""QLSD++ (Vono et al., AISTATS 2022, Algorithm 2): SVRG control variates and memory terms.

Every ``l`` rounds (``k = 0 mod l``) each client refreshes its reference point
``zeta_i = theta_k`` and its full local gradient ``grad U_i(zeta_i)``. Each round it forms

    g_i = (N_i / n_i) sum_{j in S_i} [grad U_ij(theta_k) - grad U_ij(zeta_i)] + grad U_i(zeta_i),

uploads ``Delta_i = C_i(g_i - eta_i)`` and updates its memory ``eta_i <- eta_i + alpha_i Delta_i``
(``alpha_i = 1 / (omega_i + 1)`` by default; memory terms start at zero). The server keeps
``eta = sum_i eta_i`` in step with the clients and moves

    theta_{k+1} = theta_k - gamma_k [ grad U_0(theta_k) + eta + sum_{i in A_k} w_i Delta_i ]
                  + sqrt(2 gamma_k) Z_{k+1},
    eta <- eta + sum_{i in A_k} alpha_i Delta_i.

With ``memory=False``, or equivalently ``memory_rate=0`` (alpha = 0, so eta stays 0), this is
QLSD with SVRG gradients ("QLSD++ without memory", Vono et al., supplement Figure S3); LSD++
is QLSD++ without compression. The refresh costs a full local gradient but no communication (theta_k is the
broadcast itself).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc import gradients, participation as participation_lib
from fedmcmc.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.compression import identity
from fedmcmc.samplers.common import (Broadcast, ClientInfo, ServerInfo, check_step_size,
                                     float_bits, langevin_update, server_step_size)


class QLSDPPState(NamedTuple):
    """Server state: the sample and the sum of the clients' memory terms."""

    position: Any
    memory: Any


class QLSDPPClientState(NamedTuple):
    """Client state: compressor state, memory term, SVRG reference point and its gradient."""

    compressor: Any
    memory: Any
    reference: Any
    reference_grad: Any


def qlsd_pp(model: Model, step_size, batch_size=None, compressor=None, participation: Participation | None = None,
            refresh_every: int = 100, memory: bool = True, memory_rate=None,
            name: str = "qlsd++") -> FederatedSampler:
    """Build QLSD++.

    Parameters
    ----------
    batch_size
        Minibatch size ``n_i`` (int or one per client; None for full batches).
    refresh_every
        ``l``: rounds between SVRG reference refreshes.
    memory
        Use memory terms (``eta_i``); False gives QLSD with SVRG gradients.
    memory_rate
        ``alpha`` in ``[0, 1]`` (scalar or per client); default ``1 / (omega_i + 1)``.
        ``alpha = 0`` switches a client's memory off (its ``eta_i`` stays 0), so
        ``memory_rate=0`` runs the same chain as ``memory=False``.
    """
    step_size = check_step_size(step_size)
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    if int(refresh_every) != refresh_every or refresh_every < 1:
        raise ValueError(f"refresh_every (l) must be a positive integer (got {refresh_every!r})")
    refresh_every = int(refresh_every)
    sizes = gradients.resolve_batch_sizes(batch_size)
    if memory:
        alpha = (1.0 / (np.asarray(compressor.omega(model.dim), np.float64) + 1.0)
                 if memory_rate is None else np.asarray(memory_rate, np.float64))
        if not np.all(np.isfinite(alpha)) or np.any(alpha < 0) or np.any(alpha > 1):
            raise ValueError(f"memory_rate alpha must lie in [0, 1] (got {alpha.tolist()}); "
                             "0 switches the memory off, 1 / (omega + 1) is the default")
    else:
        alpha = np.zeros(())
    alpha = jnp.asarray(alpha, jnp.float32)

    def client_alpha(index):
        return alpha[index] if alpha.ndim else alpha

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return QLSDPPState(theta0, jnp.zeros_like(theta0)), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key
        theta = broadcast.position
        zeros = jnp.zeros_like(theta)
        return QLSDPPClientState(compressor.init(theta, client_data.index), zeros, theta, zeros)

    def client_step(key, client_state, broadcast, client_data, k):
        theta = broadcast.position
        reference, reference_grad = jax.lax.cond(
            k % refresh_every == 0,
            lambda: (theta, gradients.local_gradient(model, theta, client_data)),
            lambda: (client_state.reference, client_state.reference_grad),
        )
        key_batch, key_comp = jax.random.split(key)
        if sizes is None:
            grad = gradients.local_gradient(model, theta, client_data)
        else:
            xb, w = gradients.minibatch(key_batch, client_data, sizes)
            grad = (gradients.weighted_potential_grad(model, theta, xb, w)
                    - gradients.weighted_potential_grad(model, reference, xb, w) + reference_grad)
        delta, comp_state, cinfo = compressor.apply(key_comp, grad - client_state.memory, client_state.compressor)
        new_memory = client_state.memory + client_alpha(client_data.index) * delta
        return (QLSDPPClientState(comp_state, new_memory, reference, reference_grad), delta,
                ClientInfo(bits=cinfo.bits))

    def server_step(key, server_state, uploads, mask, k):
        gamma = server_step_size(step_size, k)
        drift = server_state.memory + jnp.tensordot(participation.weights(mask), uploads, axes=1)
        position = langevin_update(key, model, server_state.position, drift, gamma)
        rates = mask.astype(jnp.float32) * jnp.broadcast_to(alpha, mask.shape)
        new_memory = server_state.memory + jnp.tensordot(rates, uploads, axes=1)
        new = QLSDPPState(participation_lib.hold_if_empty(participation, mask, position, server_state.position),
                          new_memory)
        return new, Broadcast(new.position), ServerInfo(step_size=gamma, broadcast_bits=float_bits(new.position))

    clients = per_client_count(sizes, compressor.omega(model.dim), alpha, known=(participation.num_clients,))
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients)


def lsd_pp(model: Model, step_size, batch_size=None, participation=None, refresh_every: int = 100,
           name: str = "lsd++") -> FederatedSampler:
    """LSD++ : QLSD++ without compression (and so without memory terms)."""
    return qlsd_pp(model, step_size, batch_size, identity(), participation, refresh_every,
                   memory=False, name=name)
