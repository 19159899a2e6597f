"""What travels between the Flower server and the clients, as bytes.

* Uploads travel in the compressor's real encoding: a vector the quantiser produced goes as
  its QSGD message (:func:`~fedmcmc.compression.encode_qsgd`), any other float32 array as
  :func:`~fedmcmc.compression.encode_dense` (``32 d`` bits), so the bits counted by the
  samplers (``info.bits``) are the bits on the wire. The client runs the sampler with a
  :class:`Tape`-wrapped compressor that performs the same operations as the original one
  and also hands out ``(norm, signed_levels, s)``, which is what the message encodes.
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

from fedmcmc.base import CompressionInfo, Compressor
from fedmcmc.compression import decode_dense, decode_qsgd, dequantize_np, encode_dense, encode_qsgd
from fedmcmc.compression.codec import qsgd_encoded_bits
from fedmcmc.compression.quantization import MAX_LEVELS, QuantizationState, quantize_message


class MalformedUpload(ValueError):
    """An upload the server refuses to apply."""


class Tape:
    """Records what a quantising compressor encodes, while computing exactly what it computes.

    ``wrap(compressor)`` returns a compressor whose ``apply`` runs the quantiser's own
    :func:`~fedmcmc.compression.quantization.quantize_message`, so samples are unchanged bit
    for bit, and appends the traced ``(v_hat, norm, signed_levels, s)`` to :attr:`entries`.
    Other compressors are left as they are (their output is sent dense). ``compressor.apply``
    must be called at the top level of ``client_step`` (not inside ``lax.cond``/``scan``), as
    every sampler of the library does.
    """

    def __init__(self):
        self.entries: list[tuple] = []

    def wrap(self, compressor: Compressor) -> Compressor:
        original = compressor.apply

        def apply(key, v, state):
            if not isinstance(state, QuantizationState):
                return original(key, v, state)
            v_hat, norm, signed_levels, bits = quantize_message(key, v, state.levels)
            self.entries.append((v_hat, norm, signed_levels, state.levels))
            return v_hat, state, CompressionInfo(bits=bits)

        return compressor._replace(apply=apply)

    def take(self) -> tuple:
        out, self.entries = tuple(self.entries), []
        return out


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


def encode_upload(leaves: list[np.ndarray], tape: list[tuple]) -> Encoded:
    """Encode the arrays of one upload; ``tape`` is the chain's ``(v_hat, norm, levels, s)``
    entries: an array equal bit for bit to a taped ``v_hat`` goes as its QSGD message."""
    codecs, blobs, bits = [], [], 0
    unused = list(tape)
    for leaf in leaves:
        leaf = np.asarray(leaf)
        match = next((t for t in unused if np.asarray(t[0]).shape == leaf.shape
                      and np.asarray(t[0]).tobytes() == leaf.tobytes()), None)
        if match is not None:
            unused.remove(match)
            s = int(match[3])
            blob, n = encode_qsgd(np.float32(match[1]), np.asarray(match[2]).reshape(-1), s, return_bits=True)
            codecs.append(f"qsgd/{s}")
            blobs.append(blob)
            bits += int(n)
        elif leaf.dtype == np.float32:
            codecs.append("f32")
            blobs.append(encode_dense(leaf.reshape(-1)))
            bits += 32 * leaf.size
        else:
            codecs.append("raw")
            blobs.append(leaf.astype(leaf.dtype.newbyteorder("<")).tobytes())
            bits += 8 * leaf.nbytes
    return Encoded(codecs, blobs, bits)


def decode_upload(codecs, blobs, like: list, max_norm: float) -> tuple[list[np.ndarray], int]:
    """Decode and validate one upload against the expected arrays ``like`` (shape, dtype).

    Returns the arrays and the exact number of bits they took on the wire.

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
        shape, dtype = tuple(ref.shape), np.dtype(ref.dtype)
        size = int(np.prod(shape, dtype=np.int64))
        if not isinstance(blob, (bytes, bytearray)):
            raise MalformedUpload(f"array {j}: expected bytes, got {type(blob).__name__}")
        try:
            if codec.startswith("qsgd/") and dtype == np.float32:
                s = int(codec[5:])
                if not 1 <= s <= MAX_LEVELS:
                    raise ValueError(f"number of levels {s} out of range")
                norm, levels = decode_qsgd(bytes(blob), size, s=s)
                value = dequantize_np(norm, levels, s).reshape(shape)
                bits += _qsgd_bits(levels, s)
            elif codec == "f32" and dtype == np.float32:
                value = decode_dense(bytes(blob), size).reshape(shape)
                bits += 32 * size
            elif codec == "raw" and dtype != np.float32:
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
        out.append(value)
    return out, bits


def _qsgd_bits(levels: np.ndarray, s: int) -> int:
    return int(qsgd_encoded_bits(jnp.asarray(levels), jnp.int32(s)))
