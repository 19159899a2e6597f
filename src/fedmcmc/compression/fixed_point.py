"""Uploads on a shared fixed-point grid, so that the server's sum is an exact integer sum.

``fixed_point(C, fraction_bits=p, max_abs=M)`` wraps a compressor ``C``: a client's decoded
message ``x = C.decode(m)`` is put on the grid ``2^-p Z``,

    q = clip(round(x 2^p), -B, B)  (int32),      B = round(M 2^p),

and the receiver's value of the message is ``q 2^-p``. The server aggregates the messages of the
active clients by summing their integers first, ``S = sum_{i in A} q_i`` (int32, exact and
independent of the order: ``b B < 2^31`` is checked where the grid is made), and converts once: ``w S 2^-p`` with ``w`` the
clients' common weight. Because ``2^p`` is a power of two, ``x 2^p`` and the final ``2^-p`` are
exact float32 operations, which no compiler rewrite changes, so every runtime computes the same
``q``; ``S`` becomes a float32 once, in the same way everywhere.

This is the integer representation that secure aggregation needs (the server learns only ``S``,
:mod:`fedmcmc.runtime.messaging.secagg`), and the plain runs use it too, so a secure run gives the
plain run's samples bit for bit. The message is a :class:`FixedPointMessage`: the inner message
travels in its own encoding (the grid costs no bit in a plain run); ``value`` (the client's
``q``) and ``offset`` do not travel: a receiver recomputes ``q`` from the inner message, and
``offset`` is an integer vector added on aggregation, zero from every client (the secure
server hands its unmasked sum ``S`` to the sampler as one active client's ``offset``, with that
client's inner message zero).

The grid adds a rounding error of at most ``2^-(p+1)`` per coordinate and clips coordinates
beyond ``M`` (a bias, only where ``|x_j| > M``): choose ``M`` above the uploads' scale and ``p``
as large as ``b B < 2^31`` allows (a grid beyond it is refused, naming the largest ``p``). The weights of the active clients must be equal
(:func:`check_uniform`): participation ``scaling = "active"`` or one ``p`` for all, and one
memory rate for all.

A norm bound ``C`` on what the server sums (differential privacy, :mod:`fedmcmc.privacy`) must
hold for the grid value ``q 2^-p``, not for ``x``: rounding can lengthen a vector.
:func:`grid_clip` gives the bound ``C'`` to clip ``x`` to (:func:`fedmcmc.compression.clipped`
inside the grid) so that ``||q 2^-p|| <= C``.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Compressor
from fedmcmc.core.types import Array, PRNGKey

__all__ = ["FixedPointMessage", "fixed_point", "grid_bound", "grid_clip", "weighted_sum", "check_uniform"]

#: The largest ``fraction_bits`` (float32 keeps ``x 2^p`` exact up to this).
MAX_FRACTION_BITS = 30


class FixedPointMessage(NamedTuple):
    """A fixed-point compressor's message.

    Attributes
    ----------
    inner
        The wrapped compressor's message (what travels).
    value
        int32 ``q``, the client's grid integers (computed by the client; not on the wire).
    offset
        int32 vector added to ``q`` on aggregation (zero from clients; not on the wire).
    """

    inner: Any
    value: Array
    offset: Array


def grid_bound(fraction_bits: int, max_abs: float, clients: int = 1) -> int:
    """``B = round(max_abs 2^p)``, the largest ``|q|``, checked: ``1 <= B`` and ``clients B < 2^31``,
    so that the int32 sum of ``clients`` uploads cannot wrap."""
    if isinstance(fraction_bits, bool) or not isinstance(fraction_bits, (int, np.integer)) \
            or not 0 <= fraction_bits <= MAX_FRACTION_BITS:
        raise ValueError(f"fixed_point fraction_bits must be an integer in [0, {MAX_FRACTION_BITS}] "
                         f"(got {fraction_bits!r}); the grid step is 2**-fraction_bits")
    if isinstance(max_abs, bool) or not isinstance(max_abs, (int, float)) or not np.isfinite(max_abs) or max_abs <= 0:
        raise ValueError(f"fixed_point max_abs must be a positive number (got {max_abs!r}), the largest |coordinate|")
    bound = int(round(float(max_abs) * 2.0 ** fraction_bits))
    if not 1 <= bound < 2 ** 31:
        raise ValueError(f"fixed_point max_abs * 2**fraction_bits = {bound} must lie in [1, 2**31); "
                         "lower fraction_bits or max_abs")
    if int(clients) * bound >= 2 ** 31:
        bits = math.floor(math.log2((2 ** 31 - 1) / (int(clients) * float(max_abs))))
        fix = f"fraction_bits <= {bits}" if bits >= 0 else f"max_abs < {(2 ** 31 - 1) / int(clients):.4g}"
        raise ValueError(f"fixed_point: {clients} clients x max_abs * 2**fraction_bits = {int(clients) * bound} "
                         f"reaches 2**31, so the int32 sum of the uploads can wrap; set {fix}")
    return bound


def grid_clip(bound: float, fraction_bits: int, dim: int) -> float:
    """The clip ``C' = C - sqrt(d) 2^-(p+1)`` of ``x`` under which every grid value has norm ``<= C``.

    Claim: if ``||x|| <= C'`` (exactly, for the float32 vector ``x`` that :func:`fixed_point`
    receives, as :func:`fedmcmc.compression.clipped` guarantees), then
    ``||q 2^-p|| <= C`` with ``q = clip(round(x 2^p), -B, B)``.

    Proof: ``y = x 2^p`` is exact (a power of two; no float32 overflow or underflow for
    ``|x_j| <= C' < 2^97``), and rounding to the nearest integer (any tie rule, NumPy's and
    XLA's round half to even included) gives ``|round(y_j)| <= |y_j| + 1/2``; clipping to
    ``[-B, B]`` can only lower ``|q_j|``. So ``|q_j| <= |y_j| + 1/2`` for every ``j``, and by the
    triangle inequality in ``R^d``, ``||q|| <= || |y| + 1/2 || <= ||y|| + sqrt(d) / 2``. Multiplying
    by ``2^-p``: ``||q 2^-p|| <= ||x|| + sqrt(d) 2^-(p+1) <= C' + sqrt(d) 2^-(p+1) = C``. The margin
    is the least that holds for every ``x``: ``x_j = (k + 1/2 + e) 2^-p`` rounds up in every
    coordinate, lengthening ``x`` by ``sqrt(d) 2^-(p+1)`` as ``e -> 0``
    (``tests/compression/test_clipping.py``). The server's sum of such ``q`` is exact in int32;
    it becomes float32 exactly while ``|S| <= 2^24``, beyond which its conversion rounds like any
    float sum of the run.

    Raises
    ------
    ValueError
        If ``C' <= 0``: the grid's rounding alone could exceed ``C`` (raise ``fraction_bits``).
    """
    margin = math.sqrt(dim) * 2.0 ** -(fraction_bits + 1)
    if not bound > margin:
        raise ValueError(f"a clip of {bound:g} cannot hold on the grid 2**-{fraction_bits}: rounding {dim} "
                         f"coordinates can add {margin:.3g} to a norm; raise fixed_point fraction_bits or the clip")
    return bound - margin


def fixed_point(compressor: Compressor, fraction_bits: int, max_abs: float, clients: int = 1) -> Compressor:
    """Put ``compressor``'s decoded messages on the grid ``2^-p Z`` clipped to ``[-M, M]``
    (see the module docstring).

    Parameters
    ----------
    compressor
        The compressor whose messages travel.
    fraction_bits
        ``p``: the grid step is ``2^-p``.
    max_abs
        ``M``: coordinates are clipped to ``[-M, M]``; ``B = round(M 2^p)``.
    clients
        ``b``, the most uploads the server sums: ``b B < 2^31`` is checked (:func:`grid_bound`).

    Returns
    -------
    Compressor
        Its message is a :class:`FixedPointMessage` (the inner one's bits), ``decode`` gives
        ``(q + offset) 2^-p`` (float32) and ``aggregate(weights, messages)`` the weighted sum of
        the active clients' values from their integer sum (:func:`weighted_sum`).
    """
    bound = grid_bound(fraction_bits, max_abs, clients)
    up, down = jnp.float32(2.0 ** fraction_bits), jnp.float32(2.0 ** -fraction_bits)

    def integers(inner) -> Array:
        x = compressor.decode(inner) * up
        return jnp.clip(jnp.round(x), -bound, bound).astype(jnp.int32)

    def total(message: FixedPointMessage) -> Array:
        return integers(message.inner) + message.offset

    def apply(key: PRNGKey, v: Array, state):
        inner, state, info = compressor.apply(key, v, state)
        q = integers(inner)
        return FixedPointMessage(inner, q, jnp.zeros_like(q)), state, info

    def decode(message: FixedPointMessage) -> Array:
        return total(message).astype(jnp.float32) * down

    def aggregate(weights: Array, messages: FixedPointMessage) -> Array:
        active = weights != 0
        q = jax.vmap(total)(messages)
        s = jnp.sum(jnp.where(active.reshape((-1,) + (1,) * (q.ndim - 1)), q, 0), axis=0, dtype=jnp.int32)
        return jnp.max(jnp.abs(weights)) * (s.astype(jnp.float32) * down)

    return compressor._replace(apply=apply, decode=decode, aggregate=aggregate,
                               name=f"fixed_point({compressor.name}, p={fraction_bits}, M={max_abs:g})")


def weighted_sum(compressor: Compressor, weights: Array, messages) -> Array:
    """``sum_i w_i decode(m_i)`` over the leading client axis: the compressor's own
    ``aggregate`` if it has one (:func:`fixed_point`'s integer sum), else the float sum."""
    if compressor.aggregate is not None:
        return compressor.aggregate(weights, messages)
    return jnp.tensordot(weights, jax.vmap(compressor.decode)(messages), axes=1)


def check_uniform(compressor: Compressor, name: str, values) -> None:
    """Refuse per-client ``values`` (participation weights, memory rates) that differ, for a
    compressor that aggregates from the clients' sum (one line naming the fix)."""
    v = np.asarray(values, np.float64)
    if compressor.aggregate is not None and v.size > 1 and not np.all(v == v.flat[0]):
        raise ValueError(f"{compressor.name} sums the clients' integers before weighting, so {name} must be "
                         f"the same for every client (got {v.tolist()}); use one value, or "
                         'participation scaling = "active"')
