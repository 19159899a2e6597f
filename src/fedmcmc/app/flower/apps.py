"""The Flower ``ServerApp`` and ``ClientApp`` of fedmcmc (Message API, flwr 1.41).

* ``server_app``: a plain ``@app.main()`` loop; it reads ``config`` (the run's TOML text, which
  travels in Flower's run config), ``out`` (output folder) and ``resume`` from the run config,
  discovers which SuperNode holds which client (a ``hello`` message answered with the node's
  ``partition-id``, client count and data shapes, checked by
  :class:`~fedmcmc.app.flower.grid.GridTransport`, which also lets a restarted SuperNode rejoin
  under its partition and queues a ``hold`` behind each message), builds a ``[data]`` run from the nodes'
  summaries and their answers to its estimators' ``ask`` rounds without opening a data file
  (:func:`start_server`, :mod:`fedmcmc.app.flower.nodes`, :mod:`fedmcmc.app.flower.asks`)
  and runs :class:`~fedmcmc.runtime.messaging.server.ServerRuntime` over its own push/pull loop
  (``GridTransport.send_and_receive``, polling every ``poll_interval`` seconds).
* ``client_app`` (:func:`make_client_app`, optionally wrapped in Flower mods): one handler for
  ``train`` (rounds) and ``query`` (hello, init, setup) messages that answers for the node's
  partition (``--node-config "partition-id=i"``) and the run config's ``config``
  (:func:`fedmcmc.app.flower.replies.answer`, which runs
  :class:`~fedmcmc.runtime.messaging.client.ClientRuntime`), keeping the client state in
  ``Context.state``; ``worker`` in the node config names the folder of the node's worker
  (:mod:`fedmcmc.app.flower.node_worker`), which then answers for the ClientApp process. A
  ``hold`` is answered at once, without importing JAX (docs/flower.md, "Latency per round").

A message is an ``ArrayRecord`` and a ``ConfigRecord`` (:mod:`fedmcmc.app.flower.content`).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from pathlib import Path

from flwr.app import ConfigRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedmcmc.app.flower import node_worker, replies
from fedmcmc.app.flower.clock import process_seconds
from fedmcmc.app.flower.content import HOLD, META, from_content, to_content
from fedmcmc.app.flower.grid import GridTransport
from fedmcmc.app.flower.supernode import quick_pulls
from fedmcmc.runtime.settings import FlowerSettings

# JAX and the samplers are imported on first use (:func:`fedmcmc.app.flower.replies.lib`): a
# ClientApp process that answers a ``hold`` or relays to a node worker imports none of them
# (docs/flower.md, "Latency per round").


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
    if its node config names one (``worker``, :mod:`fedmcmc.app.flower.node_worker`)."""
    m = from_content(msg.content)
    if m["kind"] == HOLD:
        return Message(to_content({"kind": HOLD}), reply_to=msg)
    index = int(context.node_config.get("partition-id", -1))
    text = str(context.run_config["config"])  # the run's config travels with the run, read once per run
    node = replies.NodeView(dict(context.node_config), {"data-dir": str(context.run_config.get("data-dir", ""))})
    store = dict(context.state[META]) if META in context.state else {}
    folder = str(context.node_config.get("worker", ""))
    if folder:
        reply, store = node_worker.ask(folder, (m, text, index, node, store))
    else:
        reply, store = replies.answer(m, text, index, node, store)
    context.state[META] = ConfigRecord(store)
    return Message(to_content({**reply, "process_seconds": process_seconds()}), reply_to=msg)


client_app = make_client_app()


# --------------------------------------------------------------------------------------
# ServerApp
# --------------------------------------------------------------------------------------


def start_server(grid: Grid, cfg_text: str, out, resume: bool = False, base_dir=None, overwrite: bool = False):
    """``(runtime, transport)`` of a run: the nodes greeted, the server's side built. A ``[data]``
    run is built from what the nodes tell (:mod:`fedmcmc.app.flower.nodes`): the server opens no
    data file; it sends the nodes the run's inputs (their standardisation) before anything else,
    asks them for what its estimators need (:mod:`fedmcmc.app.flower.asks`), and sends them the results."""
    config_lib, inputs, nodes, _, server = replies.lib()
    cfg = nodes.parsed(cfg_text)
    if "data" not in cfg:
        runtime = server.ServerRuntime(cfg_text, out, functools.partial(config_lib.from_text, start=True),
                                       resume=resume, overwrite=overwrite)
        return runtime, GridTransport(grid, runtime.b, runtime.flower)
    from fedmcmc.app.flower import asks  # after replies.lib(): JAX started on one thread first

    transport = GridTransport(grid, nodes.num_clients(cfg["data"]), FlowerSettings.from_section(cfg.get("flower")))
    summaries = [nodes.summary_from_json(transport.hellos[i]["summary"]) for i in range(transport.b)]
    nodes.check_columns(summaries, [f"SuperNode {transport.node[i]} (partition-id {i})" for i in range(transport.b)])
    info, _ = inputs.combine(cfg["data"], summaries)
    welcome = {"kind": "nodes", "inputs": json.dumps(info._asdict())}
    _tell(transport, welcome, "the run's inputs")
    remote = asks.Remote(transport, [c["n_train"] for c in info.clients])
    built = config_lib.with_start(cfg, nodes.build_from_inputs(cfg, info, base_dir, federation=remote))
    transport.welcome = {**welcome, "known": asks.known(built)}  # also for a SuperNode that rejoins
    _tell(transport, transport.welcome, "the server's results (the mode, the step)")
    runtime = server.ServerRuntime(cfg_text, out, lambda _: (cfg, built), resume=resume, overwrite=overwrite)
    runtime.stats.update(remote.stats)
    return runtime, transport


def _tell(transport: GridTransport, message: dict, what: str) -> None:
    """Send every node ``message``; a node that does not take it stops the run, named."""
    answers = transport.exchange({i: message for i in range(transport.b)}, transport.flower.round_timeout)
    missing = [i for i, r in answers.items() if r is None]
    if missing:
        raise RuntimeError(f"client(s) {missing} did not take {what}; see their SuperNodes' logs")


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
    config_lib = replies.lib()[0]
    res = config_lib.in_theta(runtime.built, res)
    evaluations, stats["evaluate"] = _evaluate(transport, runtime, res)
    return config_lib.report(runtime.cfg, runtime.built, res, Path(out), started, evaluations=evaluations,
                             flower=stats)


def _evaluate(transport: GridTransport, runtime, res) -> tuple[list | None, dict | None]:
    """``(evaluations, cost)``: a ``[data]`` run's held-out points, which stay on the nodes. One
    ``evaluate`` round sends every node the draws the outputs store; each answers its
    :func:`fedmcmc.app.outputs.evaluate` (pointwise log-likelihoods, labels and per-point
    predictive quantities of its held-out part). None where the run has no held-out points or
    releases its draws only (``[privacy] release = "draws"``)."""
    from fedmcmc.app import privacy
    from fedmcmc.runtime import io

    built = runtime.built
    if (built.inputs is None or not any(c["n_test"] for c in built.inputs.clients)
            or privacy.draws_only(built.privacy)):
        return None, None
    draws = io.stored_draws(res, built.settings.run.max_stored_draws)
    answers = transport.exchange({i: {"kind": "evaluate", "draws": [draws]} for i in range(transport.b)},
                                 transport.flower.round_timeout)
    missing = [i for i, r in answers.items() if r is None]
    if missing:
        raise RuntimeError(f"client(s) {missing} did not answer the held-out evaluation; the draws are in the "
                           "run's chunks: resume the run once every node is up (fedmcmc flower deploy --resume)")
    evaluations = [{k: v[0] for k, v in answers[i].items() if isinstance(v, list)} for i in range(transport.b)]
    up = sum(int(v.nbytes) for e in evaluations for v in e.values())
    return evaluations, {"rounds": 1, "bytes_down": int(draws.nbytes) * transport.b, "bytes_up": up}


def _median(values) -> float | None:
    return float(sorted(values)[len(values) // 2]) if values else None


server_app = ServerApp()


@server_app.main()
def main(grid: Grid, context: Context) -> None:
    quick_pulls()  # this process is Flower's ServerApp process
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
