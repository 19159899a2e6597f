"""Error-feedback memory: a wrapper that turns a compressor into one that compresses the
difference to what the receiver already knows (Horvath et al. 2019; QLSD++, Vono et al.,
AISTATS 2022, Algorithm 2).

Client ``i`` keeps a memory term ``eta_i`` (zero at first). To send ``v`` it compresses the
difference, sends the inner compressor's message, and moves its memory towards ``v``:

    Delta_i = C_i(v - eta_i),        eta_i <- eta_i + alpha_i Delta_i,

with ``alpha_i`` the memory rate (``alpha = 1 / (omega + 1)`` in the paper's experiments,
``alpha = 0`` switches the memory off). A receiver that holds ``eta_i`` estimates ``v`` by
``eta_i + Delta_i`` (unbiased, since ``E Delta_i = v - eta_i``); a server that aggregates
clients holds only ``eta = sum_i eta_i``, and keeps it in step with
:func:`memory_sum_update`: ``eta <- eta + sum_{i in A} alpha_i Delta_i`` over the clients
that sent.

The message is the inner compressor's message, so what travels and what is counted
(``CompressionInfo.bits``) is exactly what the inner compressor writes; ``decode`` gives
``Delta_i``. The wrapper is a :class:`~fedmcmc.core.base.Compressor` like the one it wraps
(the shape of an Optax transformation wrapping another), with state :class:`MemoryState`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np

from fedmcmc.compression.fixed_point import weighted_sum
from fedmcmc.core.base import Compressor
from fedmcmc.core.types import Array, PRNGKey

__all__ = ["MemoryState", "with_memory", "memory_sum_update"]


class MemoryState(NamedTuple):
    """State of a memory-wrapped compressor for one client.

    Attributes
    ----------
    inner
        The wrapped compressor's state.
    memory
        ``eta_i``, what the receiver knows of the client's vectors.
    rate
        ``alpha_i``, this client's memory rate (float32 scalar).
    """

    inner: Any
    memory: Array
    rate: Array


def _rates(rate) -> jnp.ndarray:
    alpha = np.asarray(rate, np.float64)
    if alpha.ndim > 1 or not np.all(np.isfinite(alpha)) or np.any(alpha < 0):
        raise ValueError(f"memory rate alpha must be finite and >= 0, one value or one per client "
                         f"(got {alpha.tolist()})")
    return jnp.asarray(alpha, jnp.float32)


def with_memory(compressor: Compressor, rate) -> Compressor:
    """Wrap ``compressor`` with error-feedback memory (see the module docstring).

    Parameters
    ----------
    compressor
        The compressor ``C`` applied to ``v - eta_i``.
    rate
        ``alpha_i >= 0``: one value for all clients or one per client (indexed by client index).

    Returns
    -------
    Compressor
        ``init(v_like, index) -> MemoryState`` with ``eta_i = 0``; ``apply(key, v, state) ->
        (message, state, info)`` with the inner message and bits; ``decode(message) ->
        Delta_i``; the inner ``omega``.
    """
    alpha = _rates(rate)

    def init(v_like: Array, index=0) -> MemoryState:
        rate_i = alpha[index] if alpha.ndim else alpha
        return MemoryState(compressor.init(v_like, index), jnp.zeros_like(v_like), rate_i)

    def apply(key: PRNGKey, v: Array, state: MemoryState):
        message, inner, info = compressor.apply(key, v - state.memory, state.inner)
        memory = state.memory + state.rate * compressor.decode(message)
        return message, MemoryState(inner, memory, state.rate), info

    return compressor._replace(init=init, apply=apply, name=f"memory({compressor.name})")


def memory_sum_update(memory_sum: Array, compressor: Compressor, messages, mask: Array, rate) -> Array:
    """The server's copy of ``eta = sum_i eta_i`` after a round:
    ``eta + sum_{i in A} alpha_i Delta_i``.

    Parameters
    ----------
    memory_sum
        ``eta`` before the round.
    compressor
        The wrapped compressor (its ``decode`` gives ``Delta_i``; its aggregation sums them,
        :func:`fedmcmc.compression.weighted_sum`).
    messages
        The clients' messages, leading axis ``b`` (ignored for inactive clients).
    mask
        ``[b]``, the clients that sent.
    rate
        ``alpha_i``, as given to :func:`with_memory`.
    """
    rates = mask.astype(jnp.float32) * jnp.broadcast_to(jnp.asarray(rate, jnp.float32), mask.shape)
    return memory_sum + weighted_sum(compressor, rates, messages)
