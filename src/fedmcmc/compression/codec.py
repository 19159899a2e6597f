"""A compressor's message on the wire: :func:`encode`, :func:`decode` and its counted bits.

A compressor's ``apply`` returns the message a client uploads and reports its length,
``CompressionInfo.bits``; :func:`encode` writes that message bit-exactly in exactly that
many bits (before padding to whole bytes), and :func:`decode` reads it back and checks it.
The format follows the message's type, so a compressor that wraps another (error-feedback
memory, say) and uploads the inner compressor's message travels in that message's format:

==================  ==============  ============================================  =========================
message             codec tag       format                                        bits
==================  ==============  ============================================  =========================
``QSGDMessage``     ``qsgd/<s>``    QSGD code (Elias-omega or fixed-width)        :func:`~.quantization.message_bits`
float32 array       ``f32``         IEEE-754 float32, little-endian               ``32 size``
other array         ``raw``         its own dtype, little-endian                  ``8 nbytes``
==================  ==============  ============================================  =========================

A :class:`~fedmcmc.compression.fixed_point.FixedPointMessage` travels as its inner message
(same tag, same bits): its ``value`` and ``offset`` are the receiver's to compute, and the
decoder returns them as zeros (the sampler's aggregation recomputes the integers from the
inner message). One with a nonzero offset never leaves the server and is refused.

The counted length of a message is :func:`message_bits` (JAX, jittable): the compressors
report it, the receiver counts it after decoding, and the tests check it against the
length :func:`encode` writes for every registered sampler's upload.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from fedmcmc.compression._array_codec import (
    array_bits,
    decode_dense,
    decode_raw,
    encode_dense,
    encode_raw,
)
from fedmcmc.compression._qsgd_codec import decode_qsgd, encode_qsgd
from fedmcmc.compression.fixed_point import FixedPointMessage
from fedmcmc.compression.quantization import MAX_LEVELS, QSGDMessage, dequantize_np
from fedmcmc.compression.quantization import message_bits as _qsgd_message_bits
from fedmcmc.core.types import Array

__all__ = ["Encoded", "Decoded", "is_message", "message_bits", "encode", "decode"]

#: Codec tags: ``qsgd/<s>`` (the QSGD code with ``s`` levels), float32, any other dtype.
_QSGD_TAG, _F32_TAG, _RAW_TAG = "qsgd/", "f32", "raw"


class Encoded(NamedTuple):
    """One message as it travels.

    Attributes
    ----------
    codec
        The format's tag (``"qsgd/<s>"``, ``"f32"`` or ``"raw"``), sent with the data.
    data
        The message, padded with zero bits to whole bytes.
    bits
        Its exact unpadded length, equal to :func:`message_bits` of the message.
    """

    codec: str
    data: bytes
    bits: int


class Decoded(NamedTuple):
    """One message as the receiver reads it.

    Attributes
    ----------
    message
        The message with numpy leaves, of the type and shapes it was checked against.
    value
        What the receiver reconstructs from it on the host (numpy): the message's
        ``dequantize`` for a ``QSGDMessage`` (bit-identical to the compressor's
        ``decode``), the array itself otherwise.
    bits
        The message's counted length, :func:`message_bits`.
    """

    message: Any
    value: np.ndarray
    bits: int


def is_message(x) -> bool:
    """Whether ``x`` is a compressor's message that travels whole (not array by array)."""
    return isinstance(x, (QSGDMessage, FixedPointMessage))


def message_bits(message) -> Array | int:
    """Exact unpadded length in bits of ``message`` on the wire.

    An int32 JAX scalar for a ``QSGDMessage`` (jittable; its levels may be traced), a
    Python int for an array (its length follows from its shape and dtype).
    """
    if isinstance(message, FixedPointMessage):
        return message_bits(message.inner)
    if is_message(message):
        return _qsgd_message_bits(message)
    return array_bits(message)


def encode(message) -> Encoded:
    """Write one message (a ``QSGDMessage`` or an array; numpy or concrete JAX leaves).

    Returns
    -------
    Encoded
        Its codec tag, its bytes and its exact unpadded length in bits.
    """
    if isinstance(message, FixedPointMessage):
        if np.any(np.asarray(message.offset)):
            raise ValueError("a fixed-point message with a nonzero offset does not travel (the server's own sum)")
        return encode(message.inner)
    if is_message(message):
        s = int(message.levels)
        levels = np.asarray(message.signed_levels).reshape(-1)
        data, bits = encode_qsgd(np.float32(message.norm), levels, s, return_bits=True)
        return Encoded(f"{_QSGD_TAG}{s}", data, int(bits))
    a = np.asarray(message)
    if a.dtype == np.float32:
        return Encoded(_F32_TAG, encode_dense(a.reshape(-1)), array_bits(a))
    return Encoded(_RAW_TAG, encode_raw(a), array_bits(a))


def decode(codec: str, data: bytes, like) -> Decoded:
    """Read and check one message written by :func:`encode`.

    Parameters
    ----------
    codec
        The tag sent with the data.
    data
        The bytes.
    like
        What the receiver expects: a ``QSGDMessage`` or an array of the right shapes and
        dtypes (arrays or ``jax.ShapeDtypeStruct``).

    Returns
    -------
    Decoded

    Raises
    ------
    ValueError or TypeError
        If the tag does not fit ``like``, ``data`` is not bytes-like, or the bytes are not a
        valid message of ``like``'s shape (truncated, trailing data, a level out of
        range, a number of levels outside ``[1, MAX_LEVELS]``, ...).
    """
    if not isinstance(codec, str):
        raise TypeError(f"codec tag must be a string, got {type(codec).__name__}")
    if isinstance(like, FixedPointMessage):
        inner = decode(codec, data, like.inner)
        zeros = np.zeros(tuple(like.value.shape), np.int32)
        return Decoded(FixedPointMessage(inner.message, zeros, zeros.copy()), inner.value, inner.bits)
    if is_message(like) and codec.startswith(_QSGD_TAG):
        s = int(codec[len(_QSGD_TAG):])
        if not 1 <= s <= MAX_LEVELS:
            raise ValueError(f"number of levels {s} out of range")
        shape = tuple(like.signed_levels.shape)
        norm, levels = decode_qsgd(data, int(np.prod(shape, dtype=np.int64)), s=s)
        message = QSGDMessage(np.float32(norm), levels.astype(np.int32).reshape(shape), np.int32(s))
        return Decoded(message, dequantize_np(norm, levels, s).reshape(shape), int(message_bits(message)))
    dtype = None if is_message(like) else np.dtype(like.dtype)
    if codec == _F32_TAG and dtype == np.float32:
        size = int(np.prod(like.shape, dtype=np.int64))
        value = decode_dense(data, size).reshape(like.shape)
    elif codec == _RAW_TAG and dtype is not None and dtype != np.float32:
        value = decode_raw(data, like.shape, dtype)
    else:
        raise ValueError(f"codec {codec!r} does not fit {'a message' if dtype is None else f'an array of {dtype}'}")
    return Decoded(value, value, message_bits(value))
