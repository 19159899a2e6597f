"""The identity compressor: no compression, float32 on the wire."""

from __future__ import annotations

import jax.numpy as jnp

from fedmcmc.compression._array_codec import array_bits
from fedmcmc.core.base import CompressionInfo, Compressor
from fedmcmc.core.types import Array, PRNGKey

__all__ = ["identity"]


def identity() -> Compressor:
    """The identity operator ``C(v) = v`` (omega = 0).

    The message is the vector itself, which travels as float32
    (:func:`~fedmcmc.compression.encode`), so it costs exactly ``32 d`` bits.

    Returns
    -------
    Compressor
        ``init(v_like, index=0) -> ()``; ``apply(key, v, state) -> (v, state,
        CompressionInfo(bits=int32(32 * v.size)))``; ``decode(v) -> v``; ``omega(d) -> 0.0``.
    """

    def init(v_like: Array, index=0) -> tuple:
        del v_like, index
        return ()

    def apply(key: PRNGKey, v: Array, state: tuple):
        del key
        v = jnp.asarray(v)
        return v, state, CompressionInfo(bits=jnp.asarray(array_bits(v), dtype=jnp.int32))

    def omega(d: int) -> float:
        del d
        return 0.0

    return Compressor(init=init, apply=apply, decode=lambda message: message, omega=omega, name="identity")
