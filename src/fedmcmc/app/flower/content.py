"""A runtime message as Flower records, both ways (:func:`to_content`, :func:`from_content`): an
``ArrayRecord`` (broadcasts and masks as arrays, the uploads' wire encodings as one ``uint8``
array) and a ``ConfigRecord`` of JSON strings; which Flower message type carries each kind
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
    """A runtime message as Flower records: arrays (lists of NumPy arrays: broadcasts, masks) in an
    ``ArrayRecord``, one ``Array`` each, and every ``bytes`` value (the uploads' wire encodings)
    in one ``uint8`` array ``wire`` (few arrays: each is a separate object on every hop); the rest
    as JSON strings in a ``ConfigRecord``, with the layout of the arrays."""
    arrays, config, layout, blobs = {}, {}, {}, []
    for name, value in message.items():
        if isinstance(value, bytes):
            blobs.append((name, value))
        elif isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
            arrays.update({f"{name}/{j}": Array(np.ascontiguousarray(v)) for j, v in enumerate(value)})
            layout[name] = len(value)
        else:
            config[name] = json.dumps(value)
    if blobs:
        arrays["wire"] = Array(np.frombuffer(b"".join(v for _, v in blobs), np.uint8))
    config["arrays"] = json.dumps(layout)
    config["wire"] = json.dumps([[name, len(v)] for name, v in blobs])
    return RecordDict({META: ConfigRecord(config), ARRAYS: ArrayRecord(arrays)})


def from_content(content: RecordDict) -> dict:
    """Inverse of :func:`to_content`."""
    config, arrays = content[META], content[ARRAYS]
    out = {k: json.loads(v) for k, v in config.items() if k not in ("arrays", "wire")}
    for name, n in json.loads(config["arrays"]).items():
        out[name] = [arrays[f"{name}/{j}"].numpy() for j in range(n)]
    blobs, start = json.loads(config["wire"]), 0
    wire = arrays["wire"].numpy().tobytes() if blobs else b""
    for name, length in blobs:
        out[name], start = wire[start:start + int(length)], start + int(length)
    return out


def message_type(kind: str) -> str:
    return MessageType.TRAIN if kind in TRAIN_KINDS else MessageType.QUERY
