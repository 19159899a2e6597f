"""Plain arrays on the wire (host side, numpy): float32 dense, any other dtype raw.

Dense float32 (:func:`encode_dense`, :func:`decode_dense`)
    The ``d`` coordinates as IEEE-754 float32, little-endian, ``32 d`` bits, no header: the
    message of the :func:`~fedmcmc.compression.identity` compressor, and of any float32
    array an upload carries besides a compressor's message.
Raw (:func:`encode_raw`, :func:`decode_raw`)
    An array of any other dtype as its little-endian bytes, ``8 * nbytes`` bits.

:func:`array_bits` is the length of either, known from the shape and dtype alone.
"""

from __future__ import annotations

import numpy as np

from fedmcmc.compression._bits import check_dim

__all__ = ["array_bits", "encode_dense", "decode_dense", "encode_raw", "decode_raw"]


def array_bits(a) -> int:
    """Length in bits of an array's message: ``32 size`` for float32 (dense), else ``8 nbytes``.

    ``a`` is anything with ``shape`` and ``dtype`` (a numpy or JAX array, a tracer, a
    ``ShapeDtypeStruct``).
    """
    size = int(np.prod(a.shape, dtype=np.int64))
    return 8 * np.dtype(a.dtype).itemsize * size


def _check_bytes(data) -> bytes:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"expected a bytes-like message, got {type(data).__name__}")
    return bytes(data)


def encode_dense(v) -> bytes:
    """Encode a vector as float32 little-endian bytes (``32 d`` bits, no header)."""
    arr = np.asarray(v)
    if arr.ndim != 1:
        raise ValueError(f"encode_dense expects a 1-D vector, got shape {arr.shape}")
    return arr.astype("<f4").tobytes()


def decode_dense(data: bytes, d: int) -> np.ndarray:
    """Decode :func:`encode_dense` output into a float32 array of shape ``[d]``.

    Raises
    ------
    ValueError
        If ``len(data) != 4 d``.
    """
    d = check_dim(d)
    data = _check_bytes(data)
    if len(data) != 4 * d:
        raise ValueError(
            f"malformed dense message: {len(data)} bytes for dimension {d} "
            f"(expected {4 * d})"
        )
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


def encode_raw(a) -> bytes:
    """An array's values as little-endian bytes of its own dtype (``8 nbytes`` bits)."""
    arr = np.asarray(a)
    return arr.astype(arr.dtype.newbyteorder("<")).tobytes()


def decode_raw(data: bytes, shape, dtype) -> np.ndarray:
    """Decode :func:`encode_raw` output into an array of ``shape`` and ``dtype``.

    Raises
    ------
    ValueError
        If the length of ``data`` does not fit ``shape`` and ``dtype``.
    """
    data, dtype = _check_bytes(data), np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64))
    if len(data) != size * dtype.itemsize:
        raise ValueError(f"{len(data)} bytes for {size} values of {dtype}")
    return np.frombuffer(data, dtype.newbyteorder("<")).astype(dtype).reshape(shape)
