"""What travels between the Flower server and the clients, as bytes.

* Uploads travel in the compressor's real encoding. An upload holds the compressor's own
  message (:class:`~fedmcmc.compression.QSGDMessage` from the quantiser), which goes as its
  QSGD code (:func:`~fedmcmc.compression.encode_qsgd`); any other float32 array goes as
  :func:`~fedmcmc.compression.encode_dense` (``32 d`` bits). So the bits counted by the
  samplers (``info.bits``) are the bits on the wire, and the server decodes the message
  with the sampler's own ``server_step``.
* Broadcasts, masks and client states are arrays written with :func:`pack` (``.npz``).
* :func:`decode_upload` validates every field before the server uses it: undecodable bytes,
  a wrong length or shape, a wrong codec, NaN/inf or an absurd norm raise
  :class:`MalformedUpload` (the server then treats the client as inactive for that round).
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.compression import QSGDMessage, decode_dense, decode_qsgd, dequantize_np, encode_dense, encode_qsgd
from fedmcmc.compression.codec import qsgd_encoded_bits
from fedmcmc.compression.quantization import MAX_LEVELS


class MalformedUpload(ValueError):
    """An upload the server refuses to apply."""


def pack(tree) -> bytes:
    """The leaves of a pytree of arrays as ``.npz`` bytes."""
    buf = io.BytesIO()
    np.savez(buf, *[np.asarray(x) for x in jax.tree_util.tree_leaves(tree)])
    return buf.getvalue()


def unpack(data: bytes, like) -> Any:
    """Inverse of :func:`pack`, checked against ``like`` (a pytree of arrays or ShapeDtypeStructs)."""
    leaves, treedef = jax.tree_util.tree_flatten(like)
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
    except Exception as err:  # noqa: BLE001 - any parse failure is a malformed message
        raise MalformedUpload(f"undecodable array message: {err}") from None
    if len(arrays) != len(leaves):
        raise MalformedUpload(f"array message has {len(arrays)} arrays, expected {len(leaves)}")
    for a, ref in zip(arrays, leaves):
        if a.shape != tuple(ref.shape) or a.dtype != np.dtype(ref.dtype):
            raise MalformedUpload(f"array of shape {a.shape} {a.dtype}, expected {tuple(ref.shape)} {ref.dtype}")
    return jax.tree_util.tree_unflatten(treedef, arrays)


class Encoded(NamedTuple):
    """One client's upload for one chain: one message per array of the upload pytree."""

    codecs: list[str]
    blobs: list[bytes]
    bits: int  # exact unpadded bits on the wire


def items(tree) -> list:
    """The parts of an upload that travel as one message each: compressor messages whole,
    other arrays one by one (the order of :func:`jax.tree_util.tree_leaves` within each)."""
    return jax.tree_util.tree_flatten(tree, is_leaf=lambda x: isinstance(x, QSGDMessage))[0]


def encode_upload(parts: list) -> Encoded:
    """Encode the parts (:func:`items`) of one upload for one chain."""
    codecs, blobs, bits = [], [], 0
    for part in parts:
        if isinstance(part, QSGDMessage):
            s = int(part.levels)
            blob, n = encode_qsgd(np.float32(part.norm), np.asarray(part.signed_levels).reshape(-1), s,
                                  return_bits=True)
            codecs.append(f"qsgd/{s}")
            blobs.append(blob)
            bits += int(n)
            continue
        leaf = np.asarray(part)
        if leaf.dtype == np.float32:
            codecs.append("f32")
            blobs.append(encode_dense(leaf.reshape(-1)))
            bits += 32 * leaf.size
        else:
            codecs.append("raw")
            blobs.append(leaf.astype(leaf.dtype.newbyteorder("<")).tobytes())
            bits += 8 * leaf.nbytes
    return Encoded(codecs, blobs, bits)


def decode_upload(codecs, blobs, like: list, max_norm: float) -> tuple[list[np.ndarray], int]:
    """Decode and validate one upload against its expected parts ``like`` (:func:`items` of
    the upload's shapes: a :class:`~fedmcmc.compression.QSGDMessage` or an array each).

    Returns the upload's leaves (a message's three fields in place of the message) and the
    exact number of bits they took on the wire.

    Raises
    ------
    MalformedUpload
        Undecodable bytes, wrong number of arrays, wrong codec for the dtype, wrong length,
        NaN/inf, or a float array whose norm exceeds ``max_norm``.
    """
    if len(codecs) != len(like) or len(blobs) != len(like):
        raise MalformedUpload(f"upload has {len(blobs)} arrays, expected {len(like)}")
    out, bits = [], 0
    for j, (codec, blob, ref) in enumerate(zip(codecs, blobs, like)):
        message = isinstance(ref, QSGDMessage)
        ref = ref.signed_levels if message else ref
        shape, dtype = tuple(ref.shape), np.dtype(np.float32 if message else ref.dtype)
        size = int(np.prod(shape, dtype=np.int64))
        if not isinstance(blob, (bytes, bytearray)):
            raise MalformedUpload(f"array {j}: expected bytes, got {type(blob).__name__}")
        try:
            if codec.startswith("qsgd/") and message:
                s = int(codec[5:])
                if not 1 <= s <= MAX_LEVELS:
                    raise ValueError(f"number of levels {s} out of range")
                norm, levels = decode_qsgd(bytes(blob), size, s=s)
                fields = [np.float32(norm), levels.astype(np.int32).reshape(shape), np.int32(s)]
                value = dequantize_np(norm, levels, s).reshape(shape)
                bits += _qsgd_bits(levels, s)
            elif codec == "f32" and dtype == np.float32 and not message:
                value = decode_dense(bytes(blob), size).reshape(shape)
                bits += 32 * size
            elif codec == "raw" and dtype != np.float32 and not message:
                if len(blob) != size * dtype.itemsize:
                    raise ValueError(f"{len(blob)} bytes for {size} values of {dtype}")
                value = np.frombuffer(bytes(blob), dtype.newbyteorder("<")).astype(dtype).reshape(shape)
                bits += 8 * len(blob)
            else:
                raise ValueError(f"codec {codec!r} does not fit an array of {dtype}")
        except (ValueError, TypeError) as err:
            raise MalformedUpload(f"array {j}: {err}") from None
        if np.issubdtype(dtype, np.floating):
            if not np.all(np.isfinite(value)):
                raise MalformedUpload(f"array {j}: NaN or inf")
            norm = float(np.linalg.norm(value.astype(np.float64).ravel()))
            if norm > max_norm:
                raise MalformedUpload(f"array {j}: norm {norm:.3g} exceeds max_upload_norm {max_norm:.3g}")
        if message:
            out.extend(fields)
        else:
            out.append(value)
    return out, bits


def _qsgd_bits(levels: np.ndarray, s: int) -> int:
    return int(qsgd_encoded_bits(jnp.asarray(levels), jnp.int32(s)))
