"""Pieces shared by the samplers: message types and the server's Langevin step."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core.base import Model
from fedmcmc.core.types import Array, Schedule, resolve_schedule


class Broadcast(NamedTuple):
    """What the server sends to the clients each round: the current parameter."""

    position: Array


class ClientInfo(NamedTuple):
    """Per-client, per-round facts: ``bits`` uploaded (exact wire size)."""

    bits: Array


class ServerInfo(NamedTuple):
    """Per-round facts from the server.

    Attributes
    ----------
    step_size
        gamma_k used this round.
    broadcast_bits
        Size in bits of the broadcast sent to each active client (32 per float).
    """

    step_size: Array
    broadcast_bits: Array


def float_bits(tree) -> Array:
    """Bits of a pytree of float32 arrays sent raw: 32 per entry."""
    return jnp.asarray(32 * sum(int(jnp.size(x)) for x in jax.tree_util.tree_leaves(tree)), jnp.int32)


def langevin_update(key, model: Model, position, drift, step_size):
    """One unadjusted Langevin move on the server:

    theta' = theta - gamma (grad U_0(theta) + drift) + sqrt(2 gamma) Z,   Z ~ N(0, I),

    with U_0 = -log prior counted once, here, and ``drift`` the clients' aggregated
    estimate of sum_i grad U_i(theta).
    """
    prior_grad = jax.grad(model.log_prior)(position)
    noise = jax.random.normal(key, position.shape, position.dtype)
    return position - step_size * (drift - prior_grad) + jnp.sqrt(2.0 * step_size) * noise


def server_step_size(step_size: Schedule, k):
    return jnp.asarray(resolve_schedule(step_size, k), jnp.float32)
