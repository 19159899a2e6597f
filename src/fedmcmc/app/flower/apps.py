"""The Flower ``ServerApp`` and ``ClientApp`` of fedmcmc (Message API, flwr 1.41).

* ``server_app``: a plain ``@app.main()`` loop; it reads ``config-path`` (the run's TOML),
  ``out`` (output folder) and ``resume`` from the run config, discovers which SuperNode holds
  which client (a ``hello`` message answered with the node's ``partition-id``) and runs
  :class:`~fedmcmc.runtime.flower.server.ServerRuntime` over ``grid.send_and_receive``.
* ``client_app``: one ``query`` handler that runs :class:`~fedmcmc.runtime.flower.client.ClientRuntime`
  for the node's partition (``--node-config "partition-id=i"``), keeping the client state in
  ``Context.state``; ``state-dir`` in the node config sets where the node checkpoints it.

Every message is one ``ConfigRecord`` named ``fedmcmc``: bytes stay bytes (the uploads'
wire encodings, ``.npz`` arrays), other values are JSON strings.
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
from fedmcmc.runtime.flower.client import ClientRuntime, config_hash  # noqa: E402
from fedmcmc.runtime.flower.server import ServerRuntime, log  # noqa: E402

META, ARRAYS = "fedmcmc", "fedmcmc-arrays"
#: Round messages are Flower ``train`` messages (so Flower's mods that act on training see them);
#: the other exchanges (hello, init, setup) are ``query`` messages.
TRAIN_KINDS = {"round"}


def to_content(message: dict) -> RecordDict:
    """A runtime message as Flower records: arrays (lists of NumPy arrays: broadcasts, masks;
    ``bytes``: the uploads' wire encodings, as ``uint8`` arrays) in an ``ArrayRecord``, the rest
    as JSON strings in a ``ConfigRecord`` (with the layout of the arrays)."""
    arrays, config, layout = {}, {}, {}
    for name, value in message.items():
        if isinstance(value, bytes):
            arrays[name], layout[name] = Array(np.frombuffer(value, np.uint8)), -1
        elif isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
            arrays.update({f"{name}/{j}": Array(np.ascontiguousarray(v)) for j, v in enumerate(value)})
            layout[name] = len(value)
        else:
            config[name] = json.dumps(value)
    config["arrays"] = json.dumps(layout)
    return RecordDict({META: ConfigRecord(config), ARRAYS: ArrayRecord(arrays)})


def from_content(content: RecordDict) -> dict:
    """Inverse of :func:`to_content`."""
    config, arrays = content[META], content[ARRAYS]
    out = {k: json.loads(v) for k, v in config.items() if k != "arrays"}
    for name, n in json.loads(config["arrays"]).items():
        out[name] = (arrays[name].numpy().tobytes() if n < 0
                     else [arrays[f"{name}/{j}"].numpy() for j in range(n)])
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


def _faults(node_config) -> dict:
    """Test hook: node config ``fault="KIND@ROUND"`` (``malformed``: undecodable bytes, ``fail``: an exception) makes
    this node misbehave in that round."""
    spec = str(node_config.get("fault", ""))
    if "@" not in spec:
        return {}
    kind, _, k = spec.partition("@")
    return {int(k): kind}


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
    key = (config_hash(m["config"]), index)
    if key not in _RUNTIMES:
        _RUNTIMES[key] = ClientRuntime(m["config"], index, config_lib.from_text)
    runtime = _RUNTIMES[key]
    store = dict(context.state[META]) if META in context.state else {}
    if store.get("config") not in (None, key[0]):
        store = {}  # a new run with another config on this node
    fault = _faults(context.node_config).get(m.get("k")) if m["kind"] == "round" else None
    if fault == "fail":
        raise RuntimeError(f"client {index}: injected failure in round {m['k']}")
    reply = runtime.handle(m, store)
    store["config"] = key[0]
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


class GridTransport:
    """Client indices to SuperNodes over a Flower ``Grid``."""

    def __init__(self, grid: Grid, runtime: ServerRuntime, wait: float = 300.0):
        self.grid = grid
        deadline = time.monotonic() + wait
        while len(nodes := list(grid.get_node_ids())) < runtime.b:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{len(nodes)} SuperNode(s) connected after {wait:.0f} s, the config has "
                                   f"{runtime.b} clients; start one SuperNode per client")
            time.sleep(0.2)
        self.node: dict[int, int] = {}
        self.poll = float(runtime.flower["poll_interval"])
        hello = runtime._message("hello")
        replies = self.send_and_receive(
            [Message(to_content(hello), dst_node_id=int(n), message_type=MessageType.QUERY) for n in nodes],
            runtime.flower["round_timeout"])
        for r in replies:
            if r.has_error():
                raise RuntimeError(f"SuperNode {r.metadata.src_node_id} failed to start its client: {r.error.reason}")
            i = int(from_content(r.content)["index"])
            if i in self.node:
                raise RuntimeError(f"two SuperNodes claim partition-id {i}; give each node its own partition-id")
            self.node[i] = int(r.metadata.src_node_id)
        missing = sorted(set(range(runtime.b)) - set(self.node))
        if missing:
            raise RuntimeError(f"no SuperNode answered for client(s) {missing}")
        self.index = {n: i for i, n in self.node.items()}

    def send_and_receive(self, messages: list[Message], timeout: float | None) -> list[Message]:
        """Flower's ``Grid.send_and_receive`` with our poll interval: push, then pull every
        ``poll_interval`` seconds (Flower's own checks every 3 s) until every reply is in or
        ``timeout`` seconds have passed (the missing clients are then inactive)."""
        pending = set(self.grid.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        replies: list[Message] = []
        while pending:
            got = list(self.grid.pull_messages(pending))
            replies.extend(got)
            pending.difference_update(r.metadata.reply_to_message_id for r in got)
            if not pending or (deadline is not None and time.monotonic() >= deadline):
                break
            time.sleep(self.poll if deadline is None else max(0.0, min(self.poll, deadline - time.monotonic())))
        return replies

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]:
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


def run_server(grid: Grid, cfg_text: str, out, resume: bool, engine: str) -> dict:
    """The ServerApp's work: run the rounds and write the output folder of ``fedmcmc run``."""
    started = time.perf_counter()
    runtime = ServerRuntime(cfg_text, out, config_lib.from_text, resume=resume)
    transport = GridTransport(grid, runtime)
    res = runtime.run(transport, progress=True)
    seconds = runtime.stats["round_seconds"]
    stats = {k: v for k, v in runtime.stats.items() if k != "round_seconds"}
    stats.update(engine=engine, rounds_this_session=len(seconds),
                 median_round_seconds=float(sorted(seconds)[len(seconds) // 2]) if seconds else None)
    return config_lib.report(runtime.cfg, runtime.built, res, Path(out), started, flower=stats)


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    out = Path(str(rc["out"]))
    try:
        text = Path(str(rc["config-path"])).read_text()
        run_server(grid, text, str(out), bool(rc.get("resume", False)), str(rc.get("engine", "deployment")))
    except BaseException as err:
        out.mkdir(parents=True, exist_ok=True)
        (out / "flower-error.txt").write_text(f"{type(err).__name__}: {err}\n")  # for `fedmcmc flower deploy`
        raise


def make_server_app(runs: list[tuple[str, str]], resume: bool = False, engine: str = "simulation") -> ServerApp:
    """A ServerApp bound to runs ``[(config text, out folder), ...]`` done one after the other
    on the same nodes (for :func:`flwr.simulation.run_simulation`); ``app.results`` holds
    their ``results.json`` payloads."""
    app = ServerApp()
    app.results = []

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        for cfg_text, out in runs:
            app.results.append(run_server(grid, cfg_text, out, resume, engine))

    return app


logging.getLogger("fedmcmc.runtime.flower").setLevel(logging.INFO)
