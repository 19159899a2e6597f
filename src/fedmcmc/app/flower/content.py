"""A runtime message as Flower records, both ways (:func:`to_content`, :func:`from_content`): an
``ArrayRecord`` of one ``uint8`` array (broadcasts, masks and the uploads' wire encodings) and a
``ConfigRecord`` of JSON strings; which Flower message type carries each kind
(:func:`message_type`), and the ``hold`` message. Flower and NumPy only: a ClientApp process
that relays to a node worker imports no JAX."""

from __future__ import annotations

import json
import logging

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, RecordDict

log = logging.getLogger("fedmcmc.runtime.messaging")

META, ARRAYS = "fedmcmc", "fedmcmc-arrays"
#: Round messages are Flower ``train`` messages (so Flower's mods that act on training see them);
#: the other exchanges (hello, init, setup) are ``query`` messages, and so is ``hold``.
TRAIN_KINDS = {"round"}
#: A message the server queues behind every other message of a node, answered at once: the
#: SuperNode, after its reply, finds it instead of nothing (and its idle sleep, docs/flower.md "Latency per round").
HOLD = "hold"


def to_content(message: dict) -> RecordDict:
    """A runtime message as Flower records: every array (lists of NumPy arrays: broadcasts, masks)
    and every ``bytes`` value (the uploads' wire encodings) in one ``uint8`` array ``data`` of an
    ``ArrayRecord`` (each Flower ``Array`` is a separate object that every hop pulls or pushes
    with a request of its own); the rest as JSON strings in a ``ConfigRecord``, with the layout
    of ``data``."""
    config, layout, blobs, parts = {}, [], [], []
    for name, value in message.items():
        if isinstance(value, bytes):
            blobs.append([name, len(value)])
            parts.append(value)
        elif isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
            shapes = []
            for v in value:
                if np.dtype(v.dtype.str) != v.dtype:
                    raise TypeError(f"array {name!r} has dtype {v.dtype}, which has no NumPy type string")
                shapes.append([v.dtype.str, list(v.shape)])
                parts.append(np.ascontiguousarray(v).tobytes())
            layout.append([name, shapes])
        else:
            config[name] = json.dumps(value)
    config["arrays"] = json.dumps(layout)
    config["wire"] = json.dumps(blobs)
    data = b"".join(parts)
    arrays = {"data": Array(np.frombuffer(data, np.uint8))} if data else {}
    return RecordDict({META: ConfigRecord(config), ARRAYS: ArrayRecord(arrays)})


def from_content(content: RecordDict) -> dict:
    """Inverse of :func:`to_content`."""
    config = content[META]
    out = {k: json.loads(v) for k, v in config.items() if k not in ("arrays", "wire")}
    arrays = content[ARRAYS]
    data, start = memoryview(arrays["data"].numpy().tobytes() if "data" in arrays else b""), 0
    for name, shapes in json.loads(config["arrays"]):
        out[name] = []
        for dtype, shape in shapes:
            dtype = np.dtype(dtype)
            size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
            out[name].append(np.frombuffer(data[start:start + size], dtype).reshape(shape).copy())
            start += size
    for name, length in json.loads(config["wire"]):
        out[name], start = bytes(data[start:start + int(length)]), start + int(length)
    return out


def message_type(kind: str) -> str:
    return MessageType.TRAIN if kind in TRAIN_KINDS else MessageType.QUERY
