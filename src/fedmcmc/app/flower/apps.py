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

from flwr.app import ConfigRecord, Context, Message, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid, ServerApp  # noqa: E402

from fedmcmc.app import config as config_lib  # noqa: E402
from fedmcmc.runtime.flower.client import ClientRuntime, config_hash  # noqa: E402
from fedmcmc.runtime.flower.server import ServerRuntime, log  # noqa: E402

RECORD = "fedmcmc"


def to_record(message: dict) -> ConfigRecord:
    return ConfigRecord({k: v if isinstance(v, bytes) else "json:" + json.dumps(v) for k, v in message.items()})


def from_record(record) -> dict:
    return {k: json.loads(v[5:]) if isinstance(v, str) and v.startswith("json:") else v for k, v in record.items()}


# --------------------------------------------------------------------------------------
# ClientApp
# --------------------------------------------------------------------------------------

client_app = ClientApp()
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


@client_app.query()
def query(msg: Message, context: Context) -> Message:
    m = from_record(msg.content[RECORD])
    if context.node_config.get("state-dir"):
        m["state_dir"] = str(context.node_config["state-dir"])
    _compilation_cache(m.get("state_dir"))
    index = int(context.node_config.get("partition-id", -1))
    key = (config_hash(m["config"]), index)
    if key not in _RUNTIMES:
        _RUNTIMES[key] = ClientRuntime(m["config"], index, config_lib.from_text)
    runtime = _RUNTIMES[key]
    store = dict(context.state[RECORD]) if RECORD in context.state else {}
    if store.get("config") not in (None, key[0]):
        store = {}  # a new run with another config on this node
    fault = _faults(context.node_config).get(m.get("k")) if m["kind"] == "round" else None
    if fault == "fail":
        raise RuntimeError(f"client {index}: injected failure in round {m['k']}")
    reply = runtime.handle(m, store)
    store["config"] = key[0]
    context.state[RECORD] = ConfigRecord(store)
    if fault == "malformed":  # undecodable bytes in place of the first array
        for name in reply:
            if name.startswith("blob/"):
                reply[name] = b"\xff\x00garbage"
                break
    return Message(RecordDict({RECORD: to_record(reply)}), reply_to=msg)


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
        hello = runtime._message("hello")
        replies = grid.send_and_receive(
            [Message(RecordDict({RECORD: to_record(hello)}), dst_node_id=int(n), message_type="query") for n in nodes],
            timeout=runtime.flower["round_timeout"])
        for r in replies:
            if r.has_error():
                raise RuntimeError(f"SuperNode {r.metadata.src_node_id} failed to start its client: {r.error.reason}")
            i = int(from_record(r.content[RECORD])["index"])
            if i in self.node:
                raise RuntimeError(f"two SuperNodes claim partition-id {i}; give each node its own partition-id")
            self.node[i] = int(r.metadata.src_node_id)
        missing = sorted(set(range(runtime.b)) - set(self.node))
        if missing:
            raise RuntimeError(f"no SuperNode answered for client(s) {missing}")
        self.index = {n: i for i, n in self.node.items()}

    def exchange(self, messages: dict[int, dict], timeout: float | None) -> dict[int, dict | None]:
        out: dict[int, dict | None] = {i: None for i in messages}
        sent = [Message(RecordDict({RECORD: to_record(m)}), dst_node_id=self.node[i], message_type="query")
                for i, m in messages.items()]
        for r in self.grid.send_and_receive(sent, timeout=timeout):
            i = self.index.get(int(r.metadata.src_node_id))
            if i is None or i not in messages:
                continue
            if r.has_error():
                log.warning("client %d replied with an error: %s", i, r.error.reason)
                continue
            try:
                out[i] = from_record(r.content[RECORD])
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
