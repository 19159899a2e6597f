"""A trivial echo ServerApp and ClientApp (``fedmcmc bench --flower``): Flower's default loop
(``Grid.send_and_receive``) with messages of our round's sizes, and a ClientApp that does nothing
but answer (optionally after importing JAX). It imports no fedmcmc module but the standard-library
clock (``fedmcmc.app.flower.clock``), so its process is what a trivial ClientApp costs."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedmcmc.app.flower.clock import process_seconds

client_app = ClientApp()
server_app = ServerApp()


def _content(size: int, **config) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros(size, np.uint8))}), "config": ConfigRecord(config)})


@client_app.train()
def answer(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    if config["import-jax"]:
        import jax.numpy as jnp

        jnp.asarray(msg.content["arrays"]["x"].numpy()).sum().block_until_ready()
    seconds = process_seconds()
    return Message(_content(int(config["reply-bytes"]), process_seconds=-1.0 if seconds is None else seconds),
                   reply_to=msg)


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    while len(nodes := list(grid.get_node_ids())) < int(rc["nodes"]):
        time.sleep(0.2)
    rounds, process = [], []
    for k in range(int(rc["rounds"])):
        messages = [Message(_content(int(rc["message-bytes"]), **{"reply-bytes": int(rc["reply-bytes"]),
                                                                   "import-jax": bool(rc["import-jax"])}),
                            dst_node_id=n, message_type=MessageType.TRAIN, group_id=str(k)) for n in nodes]
        start = time.perf_counter()
        replies = list(grid.send_and_receive(messages))
        rounds.append(time.perf_counter() - start)
        process += [float(r.content["config"]["process_seconds"]) for r in replies if not r.has_error()]
    out = Path(str(rc["out"]))
    (out / "results.json").write_text(json.dumps({"round_seconds": rounds, "process_seconds": process}))
    (out / "flower-done.txt").write_text("done\n")  # for LocalDeployment.wait
