"""What samplers report with every message: the broadcast, the per-client and per-round infos,
and the size of a message of raw floats."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core.types import Array


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
