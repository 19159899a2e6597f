"""The length of a QSGD message, counted in JAX (jittable, vmappable).

:func:`qsgd_encoded_bits` is the exact unpadded length of what
:func:`~._qsgd_codec.encode_qsgd` writes on the host, from the same header constants and
field widths, so a quantiser reports its message's length inside a jitted program
(:func:`~fedmcmc.compression.quantization.message_bits`). The tests check it against the
encoder on every body, tie and edge case.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from fedmcmc.compression._bits import bitlength, elias_omega_length
from fedmcmc.compression._qsgd_codec import HEADER_BITS, fixed_width
from fedmcmc.core.types import Array
from fedmcmc.core.xla import materialize


def _fixed_body_bits(s, d: int) -> Array:
    """``d (1 + bitlength(s))`` in int32 for a Python or (traced) JAX integer ``s``."""
    if isinstance(s, (int, np.integer)) and not isinstance(s, (bool, np.bool_)):
        return jnp.asarray(d * (1 + fixed_width(s)), dtype=jnp.int32)
    s = jnp.asarray(s)
    if not jnp.issubdtype(s.dtype, jnp.integer):
        raise TypeError(f"s must be an integer (array), got dtype {s.dtype}")
    return (d * (1 + bitlength(s))).astype(jnp.int32)  # bitlength(s) for s >= 1


#: Vectors up to this length get the gap code lengths of the sparse body from an
#: unrolled loop over the coordinates (fast, one fusion); longer ones block by block.
_UNROLL_MAX_D = 64
#: Block length of the gap count for long vectors (see :func:`_blocked_gap_code_bits`).
_GAP_BLOCK = 16


def _gap_code_bits(nonzero: Array) -> Array:
    """``sum_{i: nonzero_i} omega(gap_i + 1)``: the gap codes of the sparse body.

    ``gap_i + 1 = i - prev_i`` with ``prev_i`` the index of the previous nonzero (``-1``
    before the first one). For ``d <= _UNROLL_MAX_D`` the running ``prev`` is carried
    through a Python loop over the coordinates: XLA fuses the resulting straight-line
    code into one elementwise kernel over the batch, where a scan lowers to a chain of
    pad/slice/reduce-window kernels (measured on a 2-core CPU, ``vmap(vmap(.))`` over
    ``[30, 20, 50]`` levels: the whole :func:`qsgd_encoded_bits` takes about 0.1 ms
    instead of 0.24 ms). Longer vectors: :func:`_blocked_gap_code_bits`.
    """
    d = nonzero.shape[-1]
    if d > _UNROLL_MAX_D:
        return _blocked_gap_code_bits(nonzero)
    prev = jnp.full(nonzero.shape[:-1], -1, dtype=jnp.int32)
    total = jnp.zeros(nonzero.shape[:-1], dtype=jnp.int32)
    for i in range(d):
        nz_i = nonzero[..., i]
        total = total + jnp.where(nz_i, elias_omega_length(i - prev), 0)
        prev = jnp.where(nz_i, jnp.int32(i), prev)
    return total


def _blocked_gap_code_bits(nonzero: Array) -> Array:
    """:func:`_gap_code_bits` for long vectors, in ``O(d)`` work and one pass over the levels.

    The vector is cut into ``nb`` blocks of ``B = _GAP_BLOCK`` coordinates (zero-padded at
    the end). One fused kernel walks the ``B`` positions of all blocks at once (the blocks
    are stored position-major, as int8, so every step reads a contiguous row), carrying
    per block the running previous nonzero: it sums the codes of the gaps inside blocks and
    keeps each block's first and last nonzero. A gap that crosses blocks starts at the
    block's first nonzero and ends at the last nonzero of all earlier blocks, an exclusive
    max-scan over the ``nb = d / B`` blocks only. The same sum, exactly, as the running
    ``prev`` of the short path; measured on a 2-core CPU for ``[20, 79510]`` levels, 3 to 4
    times faster than a max-scan over all ``d`` positions (issue 17).
    """
    d, batch, width = nonzero.shape[-1], nonzero.shape[:-1], _GAP_BLOCK
    nb = -(-d // width)
    blocks = jnp.pad(nonzero.astype(jnp.int8), [(0, 0)] * len(batch) + [(0, nb * width - d)])
    rows = materialize(jnp.swapaxes(blocks.reshape(batch + (nb, width)), -1, -2))  # [..., B, nb]
    first = prev = jnp.full(batch + (nb,), -1, dtype=jnp.int32)
    inside = jnp.zeros(batch + (nb,), dtype=jnp.int32)
    for j in range(width):
        nz_j = rows[..., j, :] != 0
        inside = inside + jnp.where(nz_j & (prev >= 0), elias_omega_length(j - prev), 0)
        first = jnp.where(nz_j & (first < 0), jnp.int32(j), first)
        prev = jnp.where(nz_j, jnp.int32(j), prev)
    start = jnp.arange(nb, dtype=jnp.int32) * width
    last = lax.associative_scan(jnp.maximum, jnp.where(prev >= 0, start + prev, -1), axis=len(batch))
    before = jnp.concatenate([jnp.full(batch + (1,), -1, dtype=jnp.int32), last[..., :-1]], axis=-1)
    across = jnp.where(first >= 0, elias_omega_length(start + first - before), 0)
    return jnp.sum(inside + across, axis=-1)


def qsgd_encoded_bits(signed_levels: Array, s=None) -> Array:
    """Exact unpadded length in bits of :func:`~._qsgd_codec.encode_qsgd`'s message (JAX).

    .. math::

        B(l) = 2 + 32 + \\min\\Big(\\omega(\\mathrm{nnz} + 1)
               + \\sum_{i: l_i \\ne 0} [\\omega(g_i + 1) + 1 + \\omega(|l_i|)],\\;
               \\sum_i [\\omega(|l_i| + 1) + 1\\{l_i \\ne 0\\}],\\;
               d\\,(1 + \\mathrm{bitlength}(s))\\Big),

    where ``omega(.)`` is the Elias-omega code length (:func:`elias_omega_length`) and
    ``g_i`` is the number of zeros between nonzero ``i`` and the previous nonzero; the
    third (fixed-width) term is present only when ``s`` is given, matching
    ``encode_qsgd(norm, signed_levels, s)``. The gaps come from a running
    previous-nonzero index (no sort, no data-dependent loop; see
    :func:`_gap_code_bits`). The padded size is ``ceil(B / 8)`` bytes. Reference:
    Alistarh et al. (2017), QSGD, Section 3.1 (Elias coding of quantised gradients).

    Parameters
    ----------
    signed_levels
        Integer array ``[..., d]`` of signed levels; the last axis is the vector, leading
        axes are batch axes.
    s
        Number of quantisation levels, or None (the default) to leave the fixed-width
        body out, as ``encode_qsgd`` does without ``s``. A Python integer in
        ``[1, 2**31 - 1]`` (checked), or an integer JAX array (may be traced, and
        batched under ``vmap``) broadcastable to ``signed_levels.shape[:-1]``, whose
        entries must be ``>= 1``. The count assumes ``|l_i| <= s``, which
        :func:`~._qsgd_codec.encode_qsgd` enforces.

    Returns
    -------
    Array
        int32 array of shape ``signed_levels.shape[:-1]`` (broadcast with ``s``'s shape).
    """
    levels = jnp.asarray(signed_levels)
    if not jnp.issubdtype(levels.dtype, jnp.integer):
        raise TypeError(f"signed_levels must be an integer array, got {levels.dtype}")
    if levels.ndim == 0:
        raise ValueError("signed_levels must have at least one axis (the vector axis)")
    fixed = None if s is None else _fixed_body_bits(s, levels.shape[-1])
    sparse, dense = elias_body_bits(levels)
    body = jnp.minimum(sparse, dense)
    if fixed is not None:
        body = jnp.minimum(body, fixed)
    return (HEADER_BITS + body).astype(jnp.int32)


def elias_body_bits(levels: Array) -> tuple[Array, Array]:
    """Lengths in bits of the sparse and dense bodies of ``levels [..., d]`` (int32)."""
    mag = materialize(jnp.abs(levels.astype(jnp.int32)))
    nonzero = mag != 0
    nz = nonzero.astype(jnp.int32)
    dense = jnp.sum(elias_omega_length(mag + 1) + nz, axis=-1)
    nnz = jnp.sum(nz, axis=-1)
    sparse = (
        elias_omega_length(nnz + 1)
        + _gap_code_bits(nonzero)
        + jnp.sum(jnp.where(nonzero, 1 + elias_omega_length(mag), 0), axis=-1)
    )
    return sparse, dense
