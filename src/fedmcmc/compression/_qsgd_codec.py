"""The QSGD wire format on the host: :func:`encode_qsgd` and :func:`decode_qsgd` (numpy).

A quantised vector ``(norm, signed_levels)`` as produced by
:func:`~fedmcmc.compression.quantization.quantize`, Elias-omega or fixed-width coded in the
spirit of Alistarh et al. (2017), "QSGD: Communication-Efficient SGD via Gradient
Quantization and Encoding", NeurIPS, Section 3.1. The bit stream is written most
significant bit first within each byte:

======================  =====================================================
field                   content
======================  =====================================================
mode                    2 bits: ``00`` = sparse, ``01`` = dense (Elias),
                        ``10`` = fixed-width; ``11`` is invalid
norm                    32 bits: IEEE-754 bit pattern of the float32 norm,
                        big-endian (the sign bit comes first; it is always 0:
                        ``-0.0`` is written as ``+0.0`` and any NaN as the
                        quiet NaN ``0x7FC00000``)
sparse body (``00``)    ``omega(nnz + 1)``, then for each nonzero coordinate in
                        increasing index order: ``omega(gap + 1)``, where
                        ``gap`` is the number of zero coordinates skipped since
                        the previous nonzero (or since the start), one sign bit
                        (``1`` = negative), ``omega(|level|)``
dense body (``01``)     for every coordinate: ``omega(|level| + 1)``, followed by
                        one sign bit only if ``level != 0``
fixed body (``10``)     for every coordinate: one sign bit (``1`` = negative,
                        ``0`` when ``level == 0``), then ``|level|`` in exactly
                        ``w = bitlength(s)`` bits (``= ceil(log2(s + 1))``),
                        most significant bit first; ``s`` is the number of
                        quantisation levels, known to both sides
padding                 zero bits up to a whole number of bytes
======================  =====================================================

``omega(n)`` is the Elias-omega code of the integer ``n >= 1``
(:func:`~._bits.elias_omega_code`). The fixed-width body costs ``d (1 + bitlength(s))``
bits; it pays off for many levels (for ``s = 2**16``: 18 bits per coordinate against about
21 for the dense Elias body). The encoder picks the shortest body -- ties go to sparse,
then dense, then fixed -- and only considers the fixed-width body when it is given ``s``
(the decoder then needs ``s`` as well). The unpadded length of a message is exactly
``2 + 32 + min(sparse_bits, dense_bits[, fixed_bits])``, which
:func:`~._qsgd_bits.qsgd_encoded_bits` counts in JAX from the constants and widths defined
here.

The decoder validates its input: malformed data raises :class:`ValueError` and never
returns an output of the wrong size.
"""

from __future__ import annotations

import functools
import operator

import numpy as np

from fedmcmc.compression._bits import (
    BitReader,
    BitWriter,
    check_dim,
    elias_omega_decode,
    elias_omega_encode,
)

#: Largest level magnitude the QSGD format carries (``|level| + 1`` must fit in int32).
MAX_LEVEL = 2**31 - 2
#: Largest number of levels ``s`` accepted by the QSGD codec (``s`` must fit in int32).
MAX_NUM_LEVELS = 2**31 - 1
#: QSGD mode field values (``0b11`` is invalid).
MODE_SPARSE, MODE_DENSE, MODE_FIXED = 0b00, 0b01, 0b10
#: Lengths of the two header fields: the mode and the float32 norm.
MODE_BITS, NORM_BITS = 2, 32
#: QSGD header length.
HEADER_BITS = MODE_BITS + NORM_BITS
#: Bit pattern written for a NaN norm (positive quiet NaN; the sign bit is always 0).
_CANONICAL_NAN_BITS = 0x7FC00000


def check_num_levels(s) -> int:
    """``s`` as a Python int in ``[1, MAX_NUM_LEVELS]``, else :class:`ValueError`."""
    if isinstance(s, (bool, np.bool_)):
        raise ValueError(f"the number of levels s must be an integer >= 1 (got {s!r})")
    try:
        s = operator.index(s)
    except TypeError:
        raise ValueError(
            f"the number of levels s must be an integer >= 1 (got {s!r})"
        ) from None
    if not 1 <= s <= MAX_NUM_LEVELS:
        raise ValueError(
            f"the number of levels s must be an integer in [1, 2**31 - 1] (got {s})"
        )
    return s


def fixed_width(s: int) -> int:
    """``bitlength(s)``: the bits of one magnitude in the fixed-width body (checked ``s``)."""
    return check_num_levels(s).bit_length()


# --------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------


def _norm_to_bits(norm) -> int:
    arr = np.asarray(norm)
    if arr.shape != ():
        raise ValueError(f"norm must be a scalar, got shape {arr.shape}")
    value = np.asarray(arr, dtype=np.float32)
    if np.isnan(value):
        return _CANONICAL_NAN_BITS
    if value < 0:
        raise ValueError(f"norm must be non-negative (got {value!r})")
    return int(np.abs(value).view(np.uint32))  # -0.0 is written as +0.0


def _checked_levels(signed_levels, s) -> np.ndarray:
    """The levels as a 1-D int64 array with ``|l_i| <= min(s, MAX_LEVEL)``, else ValueError."""
    levels = np.asarray(signed_levels)
    if levels.ndim != 1:
        raise ValueError(f"signed_levels must be 1-D, got shape {levels.shape}")
    if levels.size and not np.issubdtype(levels.dtype, np.integer):
        raise ValueError(f"signed_levels must be integers, got dtype {levels.dtype}")
    levels = levels.astype(np.int64)
    max_abs = int(np.max(np.abs(levels))) if levels.size else 0
    if max_abs > MAX_LEVEL:
        raise ValueError(f"|signed_levels| must be <= {MAX_LEVEL}")
    if s is not None and max_abs > check_num_levels(s):
        raise ValueError(
            f"|signed_levels| must be <= s = {s} (got a level of magnitude {max_abs})"
        )
    return levels


def _write_sparse(writer: BitWriter, levels: np.ndarray) -> None:
    positions = np.flatnonzero(levels)
    elias_omega_encode(writer, len(positions) + 1)
    previous = -1
    for pos, level in zip(positions.tolist(), levels[positions].tolist()):
        elias_omega_encode(writer, pos - previous)  # gap + 1
        writer.write_bit(level < 0)
        elias_omega_encode(writer, abs(level))
        previous = pos


def _write_dense(writer: BitWriter, levels: np.ndarray) -> None:
    for level in levels.tolist():
        elias_omega_encode(writer, abs(level) + 1)
        if level:
            writer.write_bit(level < 0)


def _write_fixed(writer: BitWriter, levels: np.ndarray, width: int) -> None:
    writer.write_code(
        "".join(
            ("1" if level < 0 else "0") + format(abs(level), f"0{width}b")
            for level in levels.tolist()
        )
    )


def encode_qsgd(norm, signed_levels, s=None, *, return_bits: bool = False):
    """Encode a quantised vector in the QSGD wire format (see the module docstring).

    Parameters
    ----------
    norm
        Non-negative scalar, stored as float32.
    signed_levels
        1-D integer array ``sign(v_i) l_i`` with ``|l_i| <= 2**31 - 2``.
    s
        The number of quantisation levels, an integer in ``[1, 2**31 - 1]``, or None.
        When given, every ``|l_i|`` must be ``<= s`` and the fixed-width body
        (``bitlength(s)`` bits per magnitude) competes with the sparse and dense ones;
        the receiver must then pass the same ``s`` to :func:`decode_qsgd`. When None,
        only the sparse and dense bodies are considered (a message any receiver can
        decode without ``s``).
    return_bits
        Also return the unpadded length in bits (equal to
        ``qsgd_encoded_bits(signed_levels, s)``).

    Returns
    -------
    bytes or (bytes, int)
        The message padded with zero bits to whole bytes, and optionally its unpadded
        length in bits.

    Raises
    ------
    ValueError
        If the norm is negative or not a scalar, the levels are not a 1-D integer
        array within range (``|l_i| <= s`` when ``s`` is given), or ``s`` is not an
        integer in ``[1, 2**31 - 1]``.
    """
    norm_bits = _norm_to_bits(norm)
    levels = _checked_levels(signed_levels, s)
    bodies = [(MODE_SPARSE, _write_sparse), (MODE_DENSE, _write_dense)]
    if s is not None:
        bodies.append((MODE_FIXED, functools.partial(_write_fixed, width=fixed_width(s))))
    writers = []
    for mode, write in bodies:
        writer = BitWriter()
        writer.write_bits(mode, MODE_BITS)
        writer.write_bits(norm_bits, NORM_BITS)
        write(writer, levels)
        writers.append(writer)
    writer = min(writers, key=len)  # the first of the shortest: sparse, dense, fixed
    data = writer.to_bytes()
    return (data, len(writer)) if return_bits else data


# --------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------


def _read_sparse(reader: BitReader, d: int, s, max_level: int) -> np.ndarray:
    del s
    levels = np.zeros(d, dtype=np.int32)
    nnz = elias_omega_decode(reader) - 1
    if nnz > d:
        raise ValueError(f"malformed QSGD message: {nnz} nonzeros for dimension {d}")
    pos = -1
    for _ in range(nnz):
        pos += elias_omega_decode(reader, d)  # gap + 1
        if pos >= d:
            raise ValueError(
                f"malformed QSGD message: coordinate index {pos} >= dimension {d}"
            )
        negative = reader.read_bit()
        magnitude = elias_omega_decode(reader, max_level)
        levels[pos] = -magnitude if negative else magnitude
    return levels


def _read_dense(reader: BitReader, d: int, s, max_level: int) -> np.ndarray:
    del s
    levels = np.zeros(d, dtype=np.int32)
    for i in range(d):
        magnitude = elias_omega_decode(reader, max_level + 1) - 1
        if magnitude:
            levels[i] = -magnitude if reader.read_bit() else magnitude
    return levels


def _read_fixed(reader: BitReader, d: int, s: int, max_level: int) -> np.ndarray:
    levels = np.zeros(d, dtype=np.int32)
    width = fixed_width(s)
    for i in range(d):
        negative = reader.read_bit()
        magnitude = reader.read_bits(width)
        if magnitude > max_level:
            raise ValueError(
                f"malformed QSGD message: level {magnitude} exceeds the maximum {max_level}"
            )
        if negative and not magnitude:
            raise ValueError(f"malformed QSGD message: negative zero at coordinate {i}")
        levels[i] = -magnitude if negative else magnitude
    return levels


_READ_BODY = {MODE_SPARSE: _read_sparse, MODE_DENSE: _read_dense, MODE_FIXED: _read_fixed}


def decode_qsgd(data: bytes, d: int, *, s: int | None = None):
    """Decode a QSGD message written by :func:`encode_qsgd`.

    Parameters
    ----------
    data
        The message bytes.
    d
        Dimension of the vector (not part of the message; both sides know it).
    s
        The number of quantisation levels, an integer in ``[1, 2**31 - 1]``, or None.
        Required for a fixed-width message (it fixes the field width); when given, any
        ``|level| > s`` is rejected whatever the mode.

    Returns
    -------
    norm : np.float32
    signed_levels : np.ndarray
        int32 array of shape ``[d]``.

    Raises
    ------
    ValueError
        If the message is truncated, has trailing data or nonzero padding, the invalid
        mode ``11``, a negative norm, more nonzeros than ``d``, a coordinate index past
        ``d``, an impossible level (above ``s`` or ``2**31 - 2``), a negative zero in the
        fixed-width body, or is in fixed-width mode while ``s`` is None.
    """
    d = check_dim(d)
    if s is not None:
        s = check_num_levels(s)
    max_level = MAX_LEVEL if s is None else min(s, MAX_LEVEL)
    reader = BitReader(data)
    mode = reader.read_bits(MODE_BITS)
    if mode not in _READ_BODY:
        raise ValueError(f"malformed QSGD message: invalid mode bits {mode:02b}")
    if mode == MODE_FIXED and s is None:
        raise ValueError("fixed-width QSGD message: pass s, the number of levels, to decode it")
    norm_bits = reader.read_bits(NORM_BITS)
    if norm_bits >> (NORM_BITS - 1):
        raise ValueError("malformed QSGD message: negative norm")
    norm = np.array(norm_bits, dtype=np.uint32).view(np.float32)[()]
    levels = _READ_BODY[mode](reader, d, s, max_level)
    rest = reader.rest()
    if len(rest) >= 8:
        raise ValueError(f"malformed QSGD message: {len(rest)} trailing bits")
    if "1" in rest:
        raise ValueError("malformed QSGD message: nonzero padding bits")
    return norm, levels
