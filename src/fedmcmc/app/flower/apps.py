"""The Flower ``ServerApp`` and ``ClientApp`` of fedmcmc (Message API, flwr 1.41).

* ``server_app``: a plain ``@app.main()`` loop; it reads ``config`` (the run's TOML text, which
  travels in Flower's run config), ``out`` (output folder) and ``resume`` from the run config,
  discovers which SuperNode holds which client (a ``hello`` message answered with the node's
  ``partition-id``, client count and data shapes, checked by :class:`GridTransport`, which also
  lets a restarted SuperNode rejoin under its partition), builds a ``[data]`` run from the nodes'
  summaries without opening a data file (:func:`start_server`, :mod:`fedmcmc.app.flower.nodes`)
  and runs :class:`~fedmcmc.runtime.flower.server.ServerRuntime` over its own push/pull loop
  (:meth:`GridTransport.send_and_receive`, polling every ``poll_interval`` seconds).
* ``client_app`` (:func:`make_client_app`, optionally wrapped in Flower mods): one handler for
  ``train`` (rounds) and ``query`` (hello, init, setup) messages that runs
  :class:`~fedmcmc.runtime.flower.client.ClientRuntime` for the node's partition
  (``--node-config "partition-id=i"``) and the run config's ``config``, keeping the client state
  in ``Context.state``; ``state-dir`` in the node config sets where the node checkpoints it, and
  ``data-path`` the file a ``[data]`` run's node reads as its own client.

A message is an ``ArrayRecord`` (broadcasts and masks as arrays, the uploads' wire encodings as
``uint8`` arrays) and a ``ConfigRecord`` of JSON strings (:func:`to_content`).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

import numpy as np  # noqa: E402
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedmcmc.app import config as config_lib  # noqa: E402
from fedmcmc.app import inputs  # noqa: E402
from fedmcmc.app.flower import nodes  # noqa: E402
from fedmcmc.runtime.flower.client import ClientRuntime, config_hash  # noqa: E402
from fedmcmc.runtime.flower.server import DEFAULTS, ServerRuntime, log  # noqa: E402

META, ARRAYS = "fedmcmc", "fedmcmc-arrays"
#: Round messages are Flower ``train`` messages (so Flower's mods that act on training see them);
#: the other exchanges (hello, init, setup) are ``query`` messages.
TRAIN_KINDS = {"round"}


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

_RUNTIMES: dict[tuple, ClientRuntime] = {}
def _runtime(text: str, index: int, context: Context, store: dict) -> ClientRuntime:
    """The node's client: built from the config (a ``[problem]``), or from the run's ``Inputs``
    the server sent (the ``nodes`` message) and the node's own data (a ``[data]`` run)."""
    if "data" not in nodes.parsed(text):
        key = (config_hash(text), index)
        if key not in _RUNTIMES:
            _RUNTIMES[key] = ClientRuntime(text, index, config_lib.from_text)
        return _RUNTIMES[key]
    if "inputs" not in store:
        raise RuntimeError(f"client {index} has not received the run's inputs (the server sends them after hello)")
    key = (config_hash(text), index, store["inputs"])
    if key not in _RUNTIMES:
        train, _ = nodes.node_local(text, index, context)
        cfg, info = nodes.parsed(text), nodes.inputs_from_json(store["inputs"])
        built = nodes.build_from_inputs(cfg, info, nodes.base_dir(context))
        _RUNTIMES[key] = ClientRuntime(text, index, lambda _: (cfg, built), lambda i: nodes.own_data(train, i, info),
                                       identity=config_hash(store["inputs"]))
    return _RUNTIMES[key]


def _answer(m: dict, text: str, index: int, context: Context, store: dict) -> dict:
    """The reply to ``m``: a ``[data]`` run's ``hello`` (the node's :class:`~fedmcmc.app.inputs.ClientSummary`)
    and ``nodes`` (the run's inputs, kept in ``store``) here, the rest by the node's :class:`ClientRuntime`."""
    if m["kind"] == "hello" and "data" in nodes.parsed(text):
        _, summary = nodes.node_local(text, index, context)
        return {"index": index, "num_clients": nodes.num_clients(nodes.parsed(text)["data"]),
                "shapes": [summary.input_shape, []], "summary": nodes.summary_to_json(summary)}
    if m["kind"] == "nodes":
        store["inputs"] = m["inputs"]
        return {"ok": 1}
    return _runtime(text, index, context, store).handle(m, store)


def _faults(node_config) -> dict:
    """Test hook: node config ``fault="KIND@ROUND[,ROUND...]"`` (``malformed``: undecodable bytes,
    ``fail``: an exception) makes this node misbehave in those rounds."""
    spec = str(node_config.get("fault", ""))
    if "@" not in spec:
        return {}
    kind, _, rounds = spec.partition("@")
    return {int(k): kind for k in rounds.split(",")}


def _compilation_cache(state_dir) -> None:
    """On the deployment engine every message runs in a new process: JAX's persistent
    compilation cache (in the node's state folder) saves compiling the client's functions
    again for every round. Compiled programs are the same, so are the samples."""
    import jax

    if state_dir and not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(Path(state_dir) / "jax-cache"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def make_client_app(mods=()) -> ClientApp:
    """Our ClientApp, wrapped in Flower ``mods`` (e.g. :func:`reply_limit_mod`, Flower's
    ``message_size_mod``): name a module-level ``make_client_app([...])`` as the app's
    ``clientapp`` component to use them."""
    app = ClientApp(mods=list(mods))
    app.train()(handle)
    app.query()(handle)
    return app


def handle(msg: Message, context: Context) -> Message:
    """Answer one server message with the node's :class:`ClientRuntime`."""
    m = from_content(msg.content)
    if context.node_config.get("state-dir"):
        m["state_dir"] = str(context.node_config["state-dir"])
    _compilation_cache(m.get("state_dir"))
    index = int(context.node_config.get("partition-id", -1))
    text = str(context.run_config["config"])  # the run's config travels with the run, read once per run
    store = dict(context.state[META]) if META in context.state else {}
    if store.get("config") not in (None, config_hash(text)):
        store = {}  # a new run with another config on this node
    fault = _faults(context.node_config).get(m.get("k")) if m["kind"] == "round" else None
    if fault == "fail":
        raise RuntimeError(f"client {index}: injected failure in round {m['k']}")
    reply = _answer(m, text, index, context, store)
    store["config"] = config_hash(text)
    context.state[META] = ConfigRecord(store)
    if fault == "malformed":  # undecodable bytes in place of the first array
        for name in reply:
            if name.startswith("blob/"):
                reply[name] = b"\xff\x00garbage"
                break
    return Message(to_content(reply), reply_to=msg)


client_app = make_client_app()


# --------------------------------------------------------------------------------------
# ServerApp
# --------------------------------------------------------------------------------------


def _index(hello) -> int:
    return int(hello["index"]) if isinstance(hello, dict) else -1


class GridTransport:
    """Client indices to SuperNodes over a Flower ``Grid``.

    Before round 1 every node answers a ``hello`` (its ``partition-id``, client count and data
    shapes; kept in ``hellos``); a node that fails, a partition claimed twice or missing, another
    client count, or data shapes unlike the other nodes' stop the run with a message naming the
    SuperNode. Before each round, a SuperNode that joined since (a restarted node has a new node
    id) is greeted the same way, sent ``welcome`` if set (a ``[data]`` run's inputs), and takes
    over its partition: it rejoins the run from its own saved state."""

    def __init__(self, grid: Grid, num_clients: int, flower: dict, wait: float = 300.0):
        self.grid, self.b, self.flower, self.shapes, self.refused = grid, num_clients, flower, None, set()
        self.welcome: dict | None = None
        self.poll = float(flower["poll_interval"])
        if not 0 < self.poll <= 10:
            raise ValueError(f"[flower] poll_interval must be in (0, 10] seconds (got {self.poll}); the default is 0.1")
        deadline = time.monotonic() + wait
        while len(ids := list(grid.get_node_ids())) < self.b:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(ids)} SuperNode(s) connected after {wait:.0f} s, the config has "
                                   f"{self.b} clients; start one SuperNode per client")
            time.sleep(0.2)
        self.node: dict[int, int] = {}
        self.hellos: dict[int, dict] = {}

        def every_partition(replies):  # Flower lists a dead node for up to a minute: do not wait for it
            answered = {int(from_content(r.content)["index"]) for r in replies if not r.has_error()}
            return answered >= set(range(self.b))

        for n, h in sorted(self._hello(ids, every_partition), key=lambda r: (isinstance(r[1], dict), _index(r[1]))):
            if isinstance(h, str):
                raise RuntimeError(h)
            i = self._check(n, h)
            if i in self.node:
                raise RuntimeError(f"two SuperNodes claim partition-id {i}; give each node its own partition-id")
            self.node[i], self.hellos[i] = n, h
        missing = sorted(set(range(self.b)) - set(self.node))
        if missing:
            raise RuntimeError(f"no SuperNode answered for client(s) {missing}")
        self.index = {n: i for i, n in self.node.items()}

    def _hello(self, nodes, enough=None) -> list[tuple[int, dict | str]]:
        """(node id, hello reply, or why the node failed) for each node that answered (all of
        them, or until ``enough(replies)``)."""
        return self._send(nodes, {"kind": "hello"}, enough)

    def _send(self, nodes, message: dict, enough=None) -> list[tuple[int, dict | str]]:
        sent = [Message(to_content(message), dst_node_id=int(n), message_type=MessageType.QUERY) for n in nodes]
        return [(int(r.metadata.src_node_id),
                 f"SuperNode {r.metadata.src_node_id} failed to start its client: {r.error.reason}"
                 if r.has_error() else from_content(r.content))
                for r in self.send_and_receive(sent, self.flower["round_timeout"], enough)]

    def _check(self, n: int, h: dict) -> int:
        """The partition of node ``n`` from its hello ``h``, checked against the run and the other nodes."""
        i, name = int(h["index"]), f"SuperNode {n} (partition-id {h['index']})"
        if int(h["num_clients"]) != self.b:
            raise RuntimeError(f"{name} has {h['num_clients']} clients in its run config, the server "
                               f"{self.b}; every node needs the run's config")
        self.shapes = self.shapes or (name, h["shapes"])
        if h["shapes"] != self.shapes[1]:
            raise RuntimeError(f"{name} holds data of shapes {h['shapes']} per point, {self.shapes[0]} "
                               f"{self.shapes[1]}; every node's data needs the same features")
        return i

    def _rejoin(self) -> None:
        """Greet SuperNodes that joined since the last round; each takes over its partition."""
        new = set(map(int, self.grid.get_node_ids())) - set(self.index) - self.refused
        if not new:
            return
        self.refused |= new  # greeted once: a node that does not answer is not asked again
        for n, h in self._hello(sorted(new)):
            try:
                if isinstance(h, str):
                    raise RuntimeError(h)
                i = self._check(n, h)
                if self.welcome is not None:
                    welcomed = self._send([n], self.welcome)
                    if not welcomed or isinstance(welcomed[0][1], str):
                        raise RuntimeError(f"SuperNode {n} did not take the run's inputs")
            except RuntimeError as err:
                log.warning("ignoring a new SuperNode: %s", err)
                continue
            self.index.pop(self.node.get(i), None)
            self.node[i], self.index[n] = n, i
            log.warning("SuperNode %d joined as partition-id %d; it continues from its saved state", n, i)

    def send_and_receive(self, messages: list[Message], timeout: float | None, enough=None) -> list[Message]:
        """Flower's ``Grid.send_and_receive`` with our poll interval: push, then pull every
        ``poll_interval`` seconds (Flower's own checks every 3 s) until every reply is in,
        ``enough(replies)``, or ``timeout`` seconds have passed (the missing clients are then inactive)."""
        pending = set(self.grid.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(self.grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if not pending or (enough and enough(replies)) or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.poll if deadline is None else max(0.0, min(self.poll, deadline - time.monotonic())))
        return replies

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]:
        if any(m["kind"] == "round" for m in messages.values()):
            self._rejoin()
        out: dict[int, dict | None] = {i: None for i in messages}
        sent = [Message(to_content(m), dst_node_id=self.node[i], message_type=message_type(m["kind"]))
                for i, m in messages.items()]
        for r in self.send_and_receive(sent, timeout):
            i = self.index.get(int(r.metadata.src_node_id))
            if i is None or i not in messages:
                continue
            if r.has_error():
                log.warning("client %d replied with an error: %s", i, r.error.reason)
                continue
            try:
                out[i] = from_content(r.content)
            except Exception as err:  # noqa: BLE001 - malformed reply: client inactive
                log.warning("client %d sent an unreadable reply: %s", i, err)
        return out


def start_server(grid: Grid, cfg_text: str, out, resume: bool = False, base_dir=None):
    """``(runtime, transport)`` of a run: the nodes greeted, the server's side built. A ``[data]``
    run is built from what the nodes tell (:mod:`fedmcmc.app.flower.nodes`): the server opens no
    data file; it sends the nodes the run's inputs (their standardisation) before anything else."""
    cfg = nodes.parsed(cfg_text)
    if "data" not in cfg:
        runtime = ServerRuntime(cfg_text, out, config_lib.from_text, resume=resume)
        return runtime, GridTransport(grid, runtime.b, runtime.flower)
    transport = GridTransport(grid, nodes.num_clients(cfg["data"]), {**DEFAULTS, **cfg.get("flower", {})})
    summaries = [nodes.summary_from_json(transport.hellos[i]["summary"]) for i in range(transport.b)]
    nodes.check_columns(summaries, [f"SuperNode {transport.node[i]} (partition-id {i})" for i in range(transport.b)])
    info, _ = inputs.combine(cfg["data"], summaries)
    built = nodes.build_from_inputs(cfg, info, base_dir)
    transport.welcome = {"kind": "nodes", "inputs": json.dumps(info._asdict())}
    replies = transport.exchange({i: transport.welcome for i in range(transport.b)}, transport.flower["round_timeout"])
    missing = [i for i, r in replies.items() if r is None]
    if missing:
        raise RuntimeError(f"client(s) {missing} did not take the run's inputs; see their SuperNodes' logs")
    return ServerRuntime(cfg_text, out, lambda _: (cfg, built), resume=resume), transport


def run_server(grid: Grid, cfg_text: str, out, resume: bool, engine: str, base_dir=None) -> dict:
    """The ServerApp's work: run the rounds and write the output folder of ``fedmcmc run``."""
    started = time.perf_counter()
    runtime, transport = start_server(grid, cfg_text, out, resume, base_dir)
    res = runtime.run(transport, progress=True)
    seconds = runtime.stats["round_seconds"]
    stats = {k: v for k, v in runtime.stats.items() if k != "round_seconds"}
    stats.update(engine=engine, rounds_this_session=len(seconds),
                 median_round_seconds=float(sorted(seconds)[len(seconds) // 2]) if seconds else None,
                 max_round_seconds=float(max(seconds)) if seconds else None)
    return config_lib.report(runtime.cfg, runtime.built, res, Path(out), started, flower=stats)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    out = Path(str(rc["out"]))
    try:
        run_server(grid, str(rc["config"]), str(out), bool(rc.get("resume", False)),
                   str(rc.get("engine", "deployment")), str(rc.get("data-dir", "")) or None)
        (out / "flower-done.txt").write_text("done\n")  # every output written, for the launchers
    except BaseException as err:
        out.mkdir(parents=True, exist_ok=True)
        (out / "flower-error.txt").write_text(f"{type(err).__name__}: {err}\n")  # for `fedmcmc flower deploy`
        raise


logging.getLogger("fedmcmc.runtime.flower").setLevel(logging.INFO)
