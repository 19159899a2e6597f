"""Stochastic quantisation C^(s) (QSGD / QLSD), jittable and vmappable.

For ``v in R^d`` and an integer number of levels ``s >= 1`` (Vono et al. 2022, QLSD,
eq. (4); Alistarh et al. 2017, QSGD, Section 3.1)::

    C^(s)(v)_i = ||v||_2 sign(v_i) l_i / s,     l_i = floor(r_i) + Bernoulli(r_i - floor(r_i)),
    r_i = s |v_i| / ||v||_2,                    C^(s)(0) = 0.

The operator is unbiased, ``E[C^(s)(v)] = v``, and
``E||C^(s)(v) - v||^2 = (||v|| / s)^2 sum_i f_i (1 - f_i) <= omega ||v||^2`` with
``f_i = r_i - floor(r_i)`` and ``omega = min(d / s^2, sqrt(d) / s)``
(QSGD Lemma 3.1; QLSD Section 3).

References
----------
D. Alistarh, D. Grubic, J. Li, R. Tomioka, M. Vojnovic (2017), "QSGD:
Communication-Efficient SGD via Gradient Quantization and Encoding", NeurIPS.

M. Vono, V. Plassier, A. Durmus, A. Dieuleveut, E. Moulines (2022), "QLSD: Quantised
Langevin Stochastic Dynamics for Bayesian Federated Learning", AISTATS, eq. (4) and
supplement S1 (heterogeneous compression operators).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.compression._qsgd_bits import qsgd_encoded_bits
from fedmcmc.core.base import CompressionInfo, Compressor
from fedmcmc.core.xla import materialize
from fedmcmc.core.types import Array, PRNGKey

__all__ = [
    "QuantizationState",
    "QSGDMessage",
    "MAX_BITS",
    "MAX_LEVELS",
    "message_bits",
    "quantize",
    "dequantize",
    "dequantize_np",
    "quantization",
    "quantization_omega",
    "qsgd_bits_bound",
    "validate_levels",
]

#: Largest number of bits ``p`` of a ``p``-bit quantiser (``s = 2**p`` levels).
MAX_BITS = 24
#: Largest number of levels: ``s`` and every level are then exact in float32.
MAX_LEVELS = 2**MAX_BITS


class QuantizationState(NamedTuple):
    """State of a quantisation compressor for one client.

    Attributes
    ----------
    levels
        Number of quantisation levels ``s`` of this client (int32 scalar).
    """

    levels: Array


class QSGDMessage(NamedTuple):
    """What a quantising client uploads: the QSGD code (:func:`~fedmcmc.compression.encode`)
    writes exactly this, in :func:`message_bits` bits.

    Attributes
    ----------
    norm
        float32 scalar ``||v||_2``.
    signed_levels
        int32 array of ``v``'s shape, ``sign(v_i) l_i``.
    levels
        int32 scalar ``s``, the sender's number of levels (0 in an empty message).
    """

    norm: Array
    signed_levels: Array
    levels: Array


def message_bits(message: QSGDMessage) -> Array:
    """Exact unpadded length in bits of ``message``'s QSGD code (JAX, jittable).

    What :func:`quantization` reports as ``CompressionInfo.bits`` and what the receiver
    counts after :func:`~fedmcmc.compression.decode`: the length the host encoder writes
    (:func:`~fedmcmc.compression.encode`), with the fixed-width body enabled by the
    message's own ``s``.
    """
    return qsgd_encoded_bits(jnp.reshape(message.signed_levels, -1), message.levels)


def quantize(key: PRNGKey, v: Array, s) -> tuple[Array, Array]:
    """Stochastically quantise ``v`` on ``s`` levels (QLSD eq. (4); QSGD Section 3.1).

    .. math::

        r_i = s |v_i| / \\|v\\|_2, \\quad
        l_i = \\lfloor r_i \\rfloor + 1\\{u_i < r_i - \\lfloor r_i \\rfloor\\},
        \\quad u_i \\sim \\mathcal{U}[0, 1) \\text{ i.i.d.}

    One uniform is drawn per coordinate. The norm is computed in float32 with scaling by
    ``max_i |v_i|`` so that it neither overflows nor underflows; ``l_i`` is clipped to
    ``[0, s]`` to absorb float rounding in ``r_i``. A zero vector gives ``norm = 0`` and
    all levels 0. A vector with non-finite entries gives a non-finite norm and all
    levels 0 (so ``dequantize`` returns NaN, and the message stays small).

    Parameters
    ----------
    key
        PRNG key.
    v
        Vector to quantise (any shape; the norm is taken over all entries), cast to float32.
    s
        Number of levels, an integer ``1 <= s <= 2**24`` (Python int or int array; may be
        traced).

    Returns
    -------
    norm : Array
        float32 scalar ``||v||_2``.
    signed_levels : Array
        int32 array of ``v``'s shape, ``sign(v_i) l_i`` with ``|l_i| <= s``.
    """
    v = jnp.asarray(v, dtype=jnp.float32)
    s_f = jnp.asarray(s).astype(jnp.float32)
    mag = jnp.abs(v)
    vmax = jnp.max(mag, initial=0.0)
    scale = jnp.where(vmax > 0, vmax, 1.0)
    norm = vmax * jnp.sqrt(jnp.sum(jnp.square(mag / scale)))
    safe_norm = jnp.where(norm > 0, norm, 1.0)
    r = mag / safe_norm * s_f
    floor_r = jnp.floor(r)
    u = jax.random.uniform(key, v.shape, dtype=jnp.float32)
    levels = floor_r + (u < r - floor_r).astype(jnp.float32)
    levels = jnp.clip(levels, 0.0, s_f)
    levels = jnp.where(jnp.isfinite(levels) & jnp.isfinite(norm), levels, 0.0)
    levels = levels.astype(jnp.int32)
    # stored once: XLA would otherwise recompute the uniforms in every consumer (the bit
    # count, the decoder, a memory term), each a pass of threefry over the whole vector
    signed_levels = materialize(jnp.where(v < 0, -levels, levels))
    return norm, signed_levels


def dequantize(norm: Array, signed_levels: Array, s) -> Array:
    """Reconstruct ``v_hat = norm * signed_levels / s`` in float32 (JAX).

    The operation order is fixed, ``(norm * float32(l)) / float32(s)``, so that
    :func:`dequantize_np` reproduces it bit for bit on the host.

    Notes
    -----
    XLA's algebraic simplifier rewrites a division by a broadcast scalar,
    ``x / broadcast(s)``, into ``x * broadcast(1 / s)``, and merges chains of
    multiplications by broadcast scalars; both change the last bit for most ``s`` that
    are not powers of two. The divisor is therefore formed elementwise as
    ``float32(s) + 0 * float32(l)``: it equals ``s`` exactly (levels are finite
    integers, so ``0 * l = +0``), has the same shape and batching as the numerator,
    and is not a broadcast, so the compiled program performs a true IEEE division
    (``0 * x`` is not folded for floats because of NaN semantics). The tests check
    bit-identity against :func:`dequantize_np` eagerly, under ``jit``, ``vmap``,
    ``lax.scan`` and with a compile-time constant ``s``.
    """
    norm = jnp.asarray(norm, dtype=jnp.float32)
    s_f = jnp.maximum(jnp.asarray(s), 1).astype(jnp.float32)  # an empty message (s = 0, levels 0) decodes to 0
    levels = jnp.asarray(signed_levels).astype(jnp.float32)
    numerator = norm * levels
    divisor = s_f + 0.0 * levels
    return numerator / divisor


def dequantize_np(norm, signed_levels, s) -> np.ndarray:
    """Numpy twin of :func:`dequantize`, bit-identical (same float32 operation order)."""
    norm = np.float32(norm)
    s_f = np.float32(max(int(s), 1))
    return norm * np.asarray(signed_levels).astype(np.float32) / s_f


def _bad_level(value, where: str = "") -> ValueError:
    return ValueError(
        f"quantization levels s{where} must be an integer >= 1 (got {value!r}); "
        "use s = 2**p for a p-bit quantiser"
    )


def _as_level(value, where: str = "") -> int:
    if isinstance(value, (bool, np.bool_)):
        raise _bad_level(value, where)
    try:
        level = operator.index(value)
    except TypeError:
        if (
            isinstance(value, (float, np.floating))
            and math.isfinite(value)
            and float(value).is_integer()
        ):
            level = int(value)
        else:
            raise _bad_level(value, where) from None
    if level < 1:
        raise _bad_level(value, where)
    if level > MAX_LEVELS:
        raise ValueError(
            f"quantization levels s{where} must be <= 2**{MAX_BITS} = {MAX_LEVELS} so that "
            f"levels are exact in float32 (got {level}); use at most p = {MAX_BITS} bits"
        )
    return level


def validate_levels(levels) -> int | tuple[int, ...]:
    """Check quantisation levels eagerly.

    Parameters
    ----------
    levels
        An integer ``1 <= s <= 2**24`` (integral floats such as ``16.0`` are accepted),
        or a non-empty sequence / 1-D array of them (one per client).

    Returns
    -------
    int or tuple of int

    Raises
    ------
    ValueError
        Naming the offending value and how to fix it.
    """
    if isinstance(levels, jax.Array):
        levels = np.asarray(levels)
    if isinstance(levels, np.ndarray) and levels.ndim == 0:
        levels = levels[()]
    if isinstance(levels, (str, bytes)):
        raise _bad_level(levels)
    if isinstance(levels, (Sequence, np.ndarray)):
        values = list(levels)
        if not values:
            raise ValueError(
                "per-client quantization levels must be a non-empty sequence of integers "
                ">= 1 (got an empty sequence)"
            )
        return tuple(_as_level(x, f"[{i}]") for i, x in enumerate(values))
    return _as_level(levels)


def quantization_omega(levels, d: int):
    """``omega = min(d / s^2, sqrt(d) / s)`` (QSGD Lemma 3.1), elementwise over ``levels``."""
    s = np.asarray(levels, dtype=np.float64)
    return np.minimum(d / s**2, math.sqrt(d) / s)


def quantization(levels) -> Compressor:
    """The stochastic quantiser ``C^(s)`` as a :class:`~fedmcmc.core.base.Compressor`.

    Parameters
    ----------
    levels
        Number of levels ``s`` (an integer ``>= 1``; ``s = 2**p`` for a p-bit quantiser),
        or one per client for heterogeneous compressors (QLSD supplement S1).

    Returns
    -------
    Compressor
        ``init(v_like, index=0) -> QuantizationState`` picks client ``index``'s level
        (``index`` may be traced); ``apply(key, v, state) -> (QSGDMessage(norm,
        signed_levels, s), state, CompressionInfo(bits))`` with ``(norm, signed_levels) =
        quantize(key, v, s)`` and ``bits = message_bits(message)``, the exact unpadded
        size of its QSGD code (:func:`~fedmcmc.compression.encode`; the client's ``s``
        travels with it and enables the fixed-width body); ``decode(message) =
        dequantize(norm, signed_levels, s)``, float32;
        ``omega(d)`` is a float for a single level, a numpy array ``[num_clients]`` for
        per-client levels.

    Raises
    ------
    ValueError
        If a level is not an integer in ``[1, 2**24]``.
    """
    checked = validate_levels(levels)
    per_client = isinstance(checked, tuple)
    table = np.asarray(checked, dtype=np.int32)

    def init(v_like: Array, index=0) -> QuantizationState:
        del v_like
        if not per_client:
            return QuantizationState(levels=jnp.asarray(table, dtype=jnp.int32))
        try:
            concrete = operator.index(index)  # a traced index raises TypeError
        except TypeError:
            concrete = None
        if concrete is not None and not 0 <= concrete < len(checked):
            raise ValueError(
                f"client index {index} out of range for {len(checked)} per-client "
                "quantization levels"
            )
        return QuantizationState(levels=jnp.asarray(table)[index].astype(jnp.int32))

    def apply(key: PRNGKey, v: Array, state: QuantizationState):
        message = QSGDMessage(*quantize(key, v, state.levels), state.levels)
        return message, state, CompressionInfo(bits=message_bits(message))

    def decode(message: QSGDMessage) -> Array:
        return dequantize(message.norm, message.signed_levels, message.levels)

    def omega(d: int):
        if per_client:
            return quantization_omega(table, d)
        return float(quantization_omega(checked, d))

    if per_client:
        name = "qsgd-s[" + ",".join(str(s) for s in checked) + "]"
    else:
        name = f"qsgd-s{checked}"
    return Compressor(init=init, apply=apply, decode=decode, omega=omega, name=name)


def qsgd_bits_bound(s, d) -> float:
    """Communication-cost bound of QSGD used by the QLSD authors, in bits per message.

    Alistarh et al. (2017), Theorem 3.2 (natural logarithms), with 32 bits for the norm::

        if s <= sqrt(d/2 - sqrt(d)):
            (3 + 1.5 ln(2 (s^2 + d) / (s (s + sqrt d)))) s (s + sqrt d) + 32
        elif s == sqrt(d):
            2.8 d + 32
        else:
            (0.5 (ln(1 + (s^2 + min(d, s sqrt d)) / d) + 1) + 2) d + 32

    (When ``d/2 - sqrt(d) < 0`` the first branch does not apply.)

    Parameters
    ----------
    s
        Number of levels (``>= 1``).
    d
        Dimension (``>= 1``).
    """
    s = float(s)
    d = float(d)
    if not (s >= 1 and d >= 1):
        raise ValueError(f"qsgd_bits_bound needs s >= 1 and d >= 1 (got s={s}, d={d})")
    sqrt_d = math.sqrt(d)
    if s <= math.sqrt(max(d / 2 - sqrt_d, 0.0)):
        return (3 + 1.5 * math.log(2 * (s**2 + d) / (s * (s + sqrt_d)))) * s * (
            s + sqrt_d
        ) + 32
    if s == sqrt_d:
        return 2.8 * d + 32
    return (0.5 * (math.log(1 + (s**2 + min(d, s * sqrt_d)) / d) + 1) + 2) * d + 32
