"""The Flower ``ServerApp`` and ``ClientApp`` of fedmcmc (Message API, flwr 1.41).

* ``server_app``: a plain ``@app.main()`` loop; it reads ``config`` (the run's TOML text, which
  travels in Flower's run config), ``out`` (output folder) and ``resume`` from the run config,
  discovers which SuperNode holds which client (a ``hello`` message answered with the node's
  ``partition-id``, client count and data shapes, checked by
  :class:`~fedmcmc.app.flower.grid.GridTransport`, which also lets a restarted SuperNode rejoin
  under its partition and queues a ``hold`` behind each message), builds a ``[data]`` run from the nodes'
  summaries without opening a data file (:func:`start_server`, :mod:`fedmcmc.app.flower.nodes`)
  and runs :class:`~fedmcmc.runtime.messaging.server.ServerRuntime` over its own push/pull loop
  (``GridTransport.send_and_receive``, polling every ``poll_interval`` seconds).
* ``client_app`` (:func:`make_client_app`, optionally wrapped in Flower mods): one handler for
  ``train`` (rounds) and ``query`` (hello, init, setup) messages that runs
  :class:`~fedmcmc.runtime.messaging.client.ClientRuntime` for the node's partition
  (``--node-config "partition-id=i"``) and the run config's ``config``, keeping the client state
  in ``Context.state``; ``state-dir`` in the node config sets where the node checkpoints it,
  ``data-path`` the file a ``[data]`` run's node reads as its own client, and ``cache-dir`` where
  it keeps its compiled programs (:func:`cache_dir`), and ``worker`` the folder of the node's worker
  (:mod:`fedmcmc.app.flower.worker`), which then answers (:func:`answer`) for the ClientApp
  process. A ``hold`` is answered at once, without importing JAX (docs/flower.md, "Latency per round").

A message is an ``ArrayRecord`` (broadcasts and masks as arrays, the uploads' wire encodings as
``uint8`` arrays) and a ``ConfigRecord`` of JSON strings (:func:`to_content`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedmcmc.app.flower.clock import process_seconds  # noqa: E402
from fedmcmc.runtime.messaging.settings import flower_settings  # noqa: E402

# JAX and the samplers are imported where they are used (``_lib``): a ClientApp process that
# answers a ``hold`` imports none of them (docs/flower.md, "Latency per round").
log = logging.getLogger("fedmcmc.runtime.messaging")

META, ARRAYS = "fedmcmc", "fedmcmc-arrays"
#: Round messages are Flower ``train`` messages (so Flower's mods that act on training see them);
#: the other exchanges (hello, init, setup) are ``query`` messages, and so is ``hold``.
TRAIN_KINDS = {"round"}
#: A message the server queues behind every other message of a node, answered at once: the
#: SuperNode, after its reply, finds it instead of nothing (and a 3-s sleep, see docs/flower.md).
HOLD = "hold"


def _lib():
    """The modules a ClientApp or ServerApp needs beyond Flower (JAX, the samplers), on first use,
    with XLA started on one intra-op thread (:func:`fedmcmc.runtime.cpu.one_thread_xla`)."""
    from fedmcmc.runtime.cpu import one_thread_xla

    one_thread_xla()
    from fedmcmc.app import config, inputs
    from fedmcmc.app.flower import nodes
    from fedmcmc.runtime.messaging import client, server

    return config, inputs, nodes, client, server


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


def reply_limit_mod(max_bytes: int):
    """A Flower mod (``ClientApp(mods=[...])``) refusing to send a reply whose arrays exceed
    ``max_bytes`` bytes: the reply becomes an error, and the server treats that client as
    inactive for the round (its state stays committed, as for any refused upload)."""

    def mod(msg: Message, context: Context, call_next) -> Message:
        reply = call_next(msg, context)
        size = sum(r.count_bytes() for r in reply.content.array_records.values()) if reply.has_content() else 0
        if size > max_bytes:
            return Message(Error(code=0, reason=f"reply of {size} bytes of arrays exceeds the limit of {max_bytes}"),
                           reply_to=msg)
        return reply

    return mod


# --------------------------------------------------------------------------------------
# ClientApp
# --------------------------------------------------------------------------------------

_RUNTIMES: dict[tuple, object] = {}


def _runtime(text: str, index: int, node: NodeView, store: dict, programs):
    """The node's ``ClientRuntime``: built from the config (a ``[problem]``), or from the run's
    ``Inputs`` the server sent (the ``nodes`` message) and the node's own data (a ``[data]`` run);
    its compiled programs kept in the folder ``programs``."""
    config_lib, _, nodes, client, _ = _lib()
    if "data" not in nodes.parsed(text):
        key = (client.config_hash(text), index)
        if key not in _RUNTIMES:
            _RUNTIMES[key] = client.ClientRuntime(text, index, config_lib.from_text, programs=programs)
        return _RUNTIMES[key]
    if "inputs" not in store:
        raise RuntimeError(f"client {index} has not received the run's inputs (the server sends them after hello)")
    key = (client.config_hash(text), index, store["inputs"])
    if key not in _RUNTIMES:
        train, _ = nodes.node_local(text, index, node)
        cfg, info = nodes.parsed(text), nodes.inputs_from_json(store["inputs"])
        built = nodes.build_from_inputs(cfg, info, nodes.base_dir(node))
        _RUNTIMES[key] = client.ClientRuntime(text, index, lambda _: (cfg, built),
                                              lambda i: nodes.own_data(train, i, info),
                                              identity=client.config_hash(store["inputs"]), programs=programs)
    return _RUNTIMES[key]


class NodeView(NamedTuple):
    """What answering a message reads of Flower's ``Context`` (its ``node_config`` and
    ``run_config``), as plain dicts: it travels to a node worker (:mod:`fedmcmc.app.flower.worker`)."""

    node_config: dict
    run_config: dict


def answer(m: dict, text: str, index: int, node: NodeView, store: dict) -> tuple[dict, dict]:
    """``(reply, store)``: the reply of client ``index`` to the message ``m`` of the run ``text``,
    and the node's ``store`` (its state between messages, kept in Flower's ``Context.state``)
    after it. A ``[data]`` run's ``hello`` (the node's :class:`~fedmcmc.app.inputs.ClientSummary`)
    and ``nodes`` (the run's inputs, kept in ``store``) are answered here, the rest by the node's
    ``ClientRuntime``. Run in the ClientApp process or in the node's worker, with the same result."""
    nodes, client = _lib()[2:4]
    run = client.config_hash(text)
    if store.get("config") not in (None, run):
        store = {}  # a new run with another config on this node
    store["config"] = run
    for name in ("secagg-signing-key", "secagg-verify-keys"):  # signed key advertisements (paths)
        if node.node_config.get(name):
            store[name.replace("-", "_")] = str(node.node_config[name])
    if node.node_config.get("state-dir"):
        m["state_dir"] = str(node.node_config["state-dir"])
    if m["kind"] == "hello" and "data" in nodes.parsed(text):
        _, summary = nodes.node_local(text, index, node)
        return {"index": index, "num_clients": nodes.num_clients(nodes.parsed(text)["data"]),
                "shapes": [summary.input_shape, []], "summary": nodes.summary_to_json(summary)}, store
    if m["kind"] == "nodes":
        store["inputs"] = m["inputs"]
        return {"ok": 1}, store
    programs = cache_dir(node.node_config) / "programs"
    return _runtime(text, index, node, store, programs).handle(m, store), store


def _faults(node_config) -> dict:
    """Test hook: node config ``fault="KIND@ROUND[,ROUND...]"`` (``malformed``: undecodable bytes,
    ``fail``: an exception) makes this node misbehave in those rounds."""
    spec = str(node_config.get("fault", ""))
    if "@" not in spec:
        return {}
    kind, _, rounds = spec.partition("@")
    return {int(k): kind for k in rounds.split(",")}


def cache_dir(node_config) -> Path:
    """Where a node keeps what outlives a run, the client's compiled programs (``programs/``,
    :mod:`fedmcmc.runtime.messaging.programs`): its node config's ``cache-dir``, else the user's cache
    folder (:func:`fedmcmc.core.cache.user_cache`); not a run's output folder."""
    from fedmcmc.core.cache import user_cache  # imports JAX (fedmcmc.core): a relaying ClientApp never calls this

    given = str(node_config.get("cache-dir", "")) or None
    return Path(given) if given else user_cache()


def make_client_app(mods=()) -> ClientApp:
    """Our ClientApp, wrapped in Flower ``mods`` (e.g. :func:`reply_limit_mod`, Flower's
    ``message_size_mod``): name a module-level ``make_client_app([...])`` as the app's
    ``clientapp`` component to use them."""
    app = ClientApp(mods=list(mods))
    app.train()(handle)
    app.query()(handle)
    return app


def handle(msg: Message, context: Context) -> Message:
    """Answer one server message (a ``hold`` at once): in this process, or by the node's worker
    if its node config names one (``worker``, :mod:`fedmcmc.app.flower.worker`)."""
    m = from_content(msg.content)
    if m["kind"] == HOLD:
        return Message(to_content({"kind": HOLD}), reply_to=msg)
    index = int(context.node_config.get("partition-id", -1))
    fault = _faults(context.node_config).get(m.get("k")) if m["kind"] == "round" else None
    if fault == "fail":
        raise RuntimeError(f"client {index}: injected failure in round {m['k']}")
    text = str(context.run_config["config"])  # the run's config travels with the run, read once per run
    node = NodeView(dict(context.node_config), {"data-dir": str(context.run_config.get("data-dir", ""))})
    store = dict(context.state[META]) if META in context.state else {}
    folder = str(context.node_config.get("worker", ""))
    if folder:
        from fedmcmc.app.flower import worker

        reply, store = worker.ask(folder, (m, text, index, node, store))
    else:
        reply, store = answer(m, text, index, node, store)
    context.state[META] = ConfigRecord(store)
    if fault == "malformed":  # undecodable bytes in place of the first array
        for name in reply:
            if name.startswith("blob/"):
                reply[name] = b"\xff\x00garbage"
                break
    return Message(to_content({**reply, "process_seconds": process_seconds()}), reply_to=msg)


client_app = make_client_app()


# --------------------------------------------------------------------------------------
# ServerApp
# --------------------------------------------------------------------------------------


def start_server(grid: Grid, cfg_text: str, out, resume: bool = False, base_dir=None, overwrite: bool = False):
    """``(runtime, transport)`` of a run: the nodes greeted, the server's side built. A ``[data]``
    run is built from what the nodes tell (:mod:`fedmcmc.app.flower.nodes`): the server opens no
    data file; it sends the nodes the run's inputs (their standardisation) before anything else."""
    from fedmcmc.app.flower.grid import GridTransport

    config_lib, inputs, nodes, _, server = _lib()
    cfg = nodes.parsed(cfg_text)
    if "data" not in cfg:
        runtime = server.ServerRuntime(cfg_text, out, functools.partial(config_lib.from_text, start=True),
                                       resume=resume, overwrite=overwrite)
        return runtime, GridTransport(grid, runtime.b, runtime.messaging)
    from fedmcmc.app import whiten  # after _lib(): JAX on one thread

    whiten.setting(cfg, data_known=False)  # whiten = true refused before the nodes are greeted
    transport = GridTransport(grid, nodes.num_clients(cfg["data"]), flower_settings(cfg))
    summaries = [nodes.summary_from_json(transport.hellos[i]["summary"]) for i in range(transport.b)]
    nodes.check_columns(summaries, [f"SuperNode {transport.node[i]} (partition-id {i})" for i in range(transport.b)])
    info, _ = inputs.combine(cfg["data"], summaries)
    built = nodes.build_from_inputs(cfg, info, base_dir)
    transport.welcome = {"kind": "nodes", "inputs": json.dumps(info._asdict())}
    replies = transport.exchange({i: transport.welcome for i in range(transport.b)}, transport.flower["round_timeout"])
    missing = [i for i, r in replies.items() if r is None]
    if missing:
        raise RuntimeError(f"client(s) {missing} did not take the run's inputs; see their SuperNodes' logs")
    built = config_lib.with_start(cfg, built, data_known=False)
    return server.ServerRuntime(cfg_text, out, lambda _: (cfg, built), resume=resume, overwrite=overwrite), transport


def run_server(grid: Grid, cfg_text: str, out, resume: bool, engine: str, base_dir=None,
               overwrite: bool = False) -> dict:
    """The ServerApp's work: run the rounds and write the output folder of ``fedmcmc run``."""
    started = time.perf_counter()
    runtime, transport = start_server(grid, cfg_text, out, resume, base_dir, overwrite)
    res = runtime.run(transport, progress=True)
    seconds = runtime.stats["round_seconds"]
    stats = {k: v for k, v in runtime.stats.items() if k != "round_seconds"}
    stats.update(engine=engine, rounds_this_session=len(seconds), median_round_seconds=_median(seconds),
                 median_client_process_seconds=_median(transport.process),
                 median_round_message_bytes=_median([d for d, _ in transport.sizes]),
                 median_round_reply_bytes=_median([u for _, u in transport.sizes]),
                 max_round_seconds=float(max(seconds)) if seconds else None)
    config_lib = _lib()[0]
    return config_lib.report(runtime.cfg, runtime.built, config_lib.in_theta(runtime.built, res), Path(out), started,
                             flower=stats)


def _median(values) -> float | None:
    return float(sorted(values)[len(values) // 2]) if values else None


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    out = Path(str(rc["out"]))
    try:
        run_server(grid, str(rc["config"]), str(out), bool(rc.get("resume", False)),
                   str(rc.get("engine", "deployment")), str(rc.get("data-dir", "")) or None,
                   bool(rc.get("overwrite", False)))
        (out / "flower-done.txt").write_text("done\n")  # every output written, for the launchers
    except BaseException as err:
        out.mkdir(parents=True, exist_ok=True)
        (out / "flower-error.txt").write_text(f"{type(err).__name__}: {err}\n")  # for `fedmcmc flower deploy`
        raise


logging.getLogger("fedmcmc.runtime.messaging").setLevel(logging.INFO)
