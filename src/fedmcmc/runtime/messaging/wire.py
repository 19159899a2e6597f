"""What travels between the Flower server and the clients, as bytes.

* Uploads travel in the compressor's real encoding. An upload holds the compressor's own
  message (:class:`~fedmcmc.compression.QSGDMessage` from the quantiser) and other arrays;
  each goes as one message of :func:`fedmcmc.compression.encode` (the QSGD code, float32
  for a float32 array). So the bits counted by the samplers (``info.bits``) are the bits on
  the wire, and the server decodes the message with the sampler's own ``server_step``.
* Broadcasts, masks and setup messages travel as lists of arrays (:func:`leaves`, checked on
  arrival by :func:`from_leaves`); a node saves its client state with :func:`pack` (``.npz``).
* :func:`decode_upload` validates every field before the server uses it: undecodable bytes,
  a wrong length or shape, a wrong codec, NaN/inf or a norm above a fixed bound raise
  :class:`MalformedUpload` (the server then treats the client as inactive for that round), and
  it reports each part's norm for the server's bound learned from the uploads
  (``[flower] max_upload_norm = "auto"``, :mod:`~fedmcmc.runtime.messaging.server`).
"""

from __future__ import annotations

import io
from typing import Any, NamedTuple

import jax
import numpy as np

from fedmcmc.compression import decode, encode, is_message


class MalformedUpload(ValueError):
    """An upload the server refuses to apply."""


def leaves(tree) -> list[np.ndarray]:
    """The leaves of a pytree of arrays, as NumPy arrays (how arrays travel in a message)."""
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def from_leaves(arrays, like) -> Any:
    """Inverse of :func:`leaves`, checked against ``like`` (a pytree of arrays or ShapeDtypeStructs).

    Raises
    ------
    MalformedUpload
        A wrong number of arrays, or an array of the wrong shape or dtype.
    """
    refs, treedef = jax.tree_util.tree_flatten(like)
    arrays = [np.asarray(a) for a in arrays]
    if len(arrays) != len(refs):
        raise MalformedUpload(f"array message has {len(arrays)} arrays, expected {len(refs)}")
    for a, ref in zip(arrays, refs):
        if a.shape != tuple(ref.shape) or a.dtype != np.dtype(ref.dtype):
            raise MalformedUpload(f"array of shape {a.shape} {a.dtype}, expected {tuple(ref.shape)} {ref.dtype}")
    return jax.tree_util.tree_unflatten(treedef, arrays)


def pack(tree) -> bytes:
    """The leaves of a pytree of arrays as ``.npz`` bytes (a node's saved client state)."""
    buf = io.BytesIO()
    np.savez(buf, *leaves(tree))
    return buf.getvalue()


def unpack(data: bytes, like) -> Any:
    """Inverse of :func:`pack`, checked against ``like`` (see :func:`from_leaves`)."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = [z[f"arr_{i}"] for i in range(len(z.files))]
    except Exception as err:  # noqa: BLE001 - any parse failure is a malformed message
        raise MalformedUpload(f"undecodable array message: {err}") from None
    return from_leaves(arrays, like)


class Encoded(NamedTuple):
    """One client's upload for one chain: one message per array of the upload pytree."""

    codecs: list[str]
    blobs: list[bytes]
    bits: int  # exact unpadded bits on the wire


def items(tree) -> list:
    """The parts of an upload that travel as one message each: compressor messages whole,
    other arrays one by one (the order of :func:`jax.tree_util.tree_leaves` within each)."""
    return jax.tree_util.tree_flatten(tree, is_leaf=is_message)[0]


def encode_upload(parts: list) -> Encoded:
    """Encode the parts (:func:`items`) of one upload for one chain."""
    messages = [encode(part) for part in parts]
    return Encoded([m.codec for m in messages], [m.data for m in messages], sum(m.bits for m in messages))


def decode_upload(codecs, blobs, like: list, max_norm: float) -> tuple[list[np.ndarray], int, list[float]]:
    """Decode and validate one upload against its expected parts ``like`` (:func:`items` of
    the upload's shapes: a :class:`~fedmcmc.compression.QSGDMessage` or an array each).

    Returns the upload's leaves (a message's three fields in place of the message), the exact
    number of bits they took on the wire, and each part's decoded norm (0 for an integer array).

    Raises
    ------
    MalformedUpload
        Undecodable bytes, wrong number of arrays, wrong codec for the dtype, wrong length,
        NaN/inf, or a float array whose norm exceeds ``max_norm``.
    """
    if len(codecs) != len(like) or len(blobs) != len(like):
        raise MalformedUpload(f"upload has {len(blobs)} arrays, expected {len(like)}")
    out, bits, norms = [], 0, []
    for j, (codec, blob, ref) in enumerate(zip(codecs, blobs, like)):
        try:
            got = decode(codec, blob, ref)
        except (ValueError, TypeError) as err:
            raise MalformedUpload(f"array {j}: {err}") from None
        norm = 0.0
        if np.issubdtype(got.value.dtype, np.floating):
            if not np.all(np.isfinite(got.value)):
                raise MalformedUpload(f"array {j}: NaN or inf")
            norm = float(np.linalg.norm(got.value.astype(np.float64).ravel()))
            if norm > max_norm:
                raise MalformedUpload(f"array {j}: norm {norm:.3g} exceeds max_upload_norm {max_norm:.3g}")
        out.extend(jax.tree_util.tree_leaves(got.message))
        bits += got.bits
        norms.append(norm)
    return out, bits, norms
