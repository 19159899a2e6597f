"""A node's side of a run on Flower: :func:`answer` gives client ``index``'s reply to one server
message and the node's state after it, in the ClientApp process or in the node's worker
(:mod:`fedmcmc.app.flower.node_worker`), with the same result.

``state-dir`` in the node config sets where the node checkpoints its client state, ``data-path``
the file a ``[data]`` run's node reads as its own client, and ``cache-dir`` where it keeps its
compiled programs (:func:`cache_dir`).

This module imports neither JAX nor the samplers: :func:`lib` does, on first use, so that a
ClientApp process that relays to a node worker (or answers a ``hold``) imports none of them
(docs/flower.md, "Latency per round").
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


def lib():
    """The modules a ClientApp or ServerApp needs beyond Flower (JAX, the samplers), on first use,
    with XLA started on one intra-op thread (:func:`fedmcmc.runtime.cpu.one_thread_xla`)."""
    # imported here, not at the top: JAX is started on one thread before it is imported, and a
    # relaying ClientApp process never imports it
    from fedmcmc.runtime.cpu import one_thread_xla

    one_thread_xla()
    from fedmcmc.app import config, inputs
    from fedmcmc.app.flower import nodes
    from fedmcmc.runtime.messaging import client, server

    return config, inputs, nodes, client, server


class NodeView(NamedTuple):
    """What answering a message reads of Flower's ``Context`` (its ``node_config`` and
    ``run_config``), as plain dicts: it travels to a node worker (:mod:`fedmcmc.app.flower.node_worker`)."""

    node_config: dict
    run_config: dict


_RUNTIMES: dict[tuple, object] = {}


def _inputs(text: str, index: int, store: dict):
    """``(config, Inputs)`` of a ``[data]`` run on this node: its parsed config and the run's
    inputs the server sent (the ``nodes`` message), which every message after ``hello`` needs."""
    nodes = lib()[2]
    if "inputs" not in store:
        raise RuntimeError(f"client {index} has not received the run's inputs (the server sends them after hello)")
    return nodes.parsed(text), nodes.inputs_from_json(store["inputs"])


def _runtime(text: str, index: int, node: NodeView, store: dict, programs):
    """The node's ``ClientRuntime``: built from the config (a ``[problem]``), or from the run's
    ``Inputs`` the server sent (the ``nodes`` message) and the node's own data (a ``[data]`` run);
    its compiled programs kept in the folder ``programs``."""
    config_lib, _, nodes, client, _ = lib()
    if "data" not in nodes.parsed(text):
        key = (client.config_hash(text), index)
        if key not in _RUNTIMES:
            _RUNTIMES[key] = client.ClientRuntime(text, index, config_lib.from_text, programs=programs)
        return _RUNTIMES[key]
    key = (client.config_hash(text), index, store.get("inputs"), store.get("known"))
    if key not in _RUNTIMES:  # parsed once per run: every round message comes here
        cfg, info = _inputs(text, index, store)
        if "known" not in store:
            raise RuntimeError(f"client {index} has not received the server's results (the mode, the step) before "
                               "its rounds")
        train, _, _ = nodes.node_local(text, index, node)
        built = nodes.build_from_inputs(cfg, info, nodes.base_dir(node), known=store["known"])
        _RUNTIMES[key] = client.ClientRuntime(text, index, lambda _: (cfg, built),
                                              lambda i: nodes.own_data(train, i, info),
                                              identity=client.config_hash(store["inputs"] + store["known"]),
                                              programs=programs)
    return _RUNTIMES[key]


def answer(m: dict, text: str, index: int, node: NodeView, store: dict) -> tuple[dict, dict]:
    """``(reply, store)``: the reply of client ``index`` to the message ``m`` of the run ``text``,
    and the node's ``store`` (its state between messages, kept in Flower's ``Context.state``)
    after it. A ``[data]`` run's ``hello`` (the node's :class:`~fedmcmc.app.inputs.ClientSummary`)
    and ``nodes`` (the run's inputs, kept in ``store``) are answered here, the rest by the node's
    ``ClientRuntime``. Run in the ClientApp process or in the node's worker, with the same result."""
    nodes, client = lib()[2:4]
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
        _, _, summary = nodes.node_local(text, index, node)
        return {"index": index, "num_clients": nodes.num_clients(nodes.parsed(text)["data"]),
                "shapes": [summary.input_shape, []], "summary": nodes.summary_to_json(summary)}, store
    if m["kind"] == "nodes":  # the run's inputs, then again with the server's results (asks.known)
        store["inputs"] = m["inputs"]
        if "known" in m:
            store["known"] = m["known"]
        return {"ok": 1}, store
    if m["kind"] == "ask":
        return _ask(m, text, index, node, store), store
    if m["kind"] == "evaluate":
        return _evaluate(m, text, index, node, store), store
    programs = cache_dir(node.node_config) / "programs"
    return _runtime(text, index, node, store, programs).handle(m, store), store


def _ask(m: dict, text: str, index: int, node: NodeView, store: dict) -> dict:
    """A ``[data]`` node's answer to an ``ask`` of the server's estimators (:class:`fedmcmc.app.flower.asks.Node`)
    on its own training rows, scaled as the run's inputs say."""
    from fedmcmc.app.flower import asks

    _, inputs, nodes, client, _ = lib()
    cfg, info = _inputs(text, index, store)
    key = (client.config_hash(text), index, store["inputs"])
    if key not in _ASKED:
        train, _, _ = nodes.node_local(text, index, node)
        _ASKED[key] = asks.Node(inputs.model_from_config(cfg, info, nodes.base_dir(node)),
                                nodes.own_data(train, index, info), len(info.clients) if _exact(cfg) else 1)
        if len(_ASKED) > 8:
            _ASKED.pop(next(iter(_ASKED)))
    return _ASKED[key].answer(m)


_ASKED: dict[tuple, object] = {}  # a [data] node's side of the asks, per run


def _evaluate(m: dict, text: str, index: int, node: NodeView, store: dict) -> dict:
    """A ``[data]`` node's held-out points under the draws the server sent
    (:func:`fedmcmc.app.outputs.evaluate` on its own held-out part, the model in the target's units):
    what ``posterior.nc``'s ``log_likelihood`` group and ``summary.json``'s metrics need of it."""
    from fedmcmc.app import outputs

    _, inputs, nodes, _, _ = lib()
    cfg, info = _inputs(text, index, store)
    _, test, _ = nodes.node_local(text, index, node)
    model = inputs.in_target_units(inputs.model_from_config(cfg, info, nodes.base_dir(node)), info)
    got = outputs.evaluate(model, m["draws"][0], inputs.held_out_part(test, info), info.task)
    return {name: [value] for name, value in got.items()}


def _exact(cfg: dict) -> bool:
    from fedmcmc.runtime.settings import FlowerSettings

    return FlowerSettings.from_section(cfg.get("flower")).exact


def cache_dir(node_config) -> Path:
    """Where a node keeps what outlives a run, the client's compiled programs (``programs/``,
    :mod:`fedmcmc.runtime.messaging.stored_programs`): its node config's ``cache-dir``, else the user's cache
    folder (:func:`fedmcmc.core.cache.user_cache`); not a run's output folder."""
    from fedmcmc.core.cache import user_cache  # imports JAX (fedmcmc.core): a relaying ClientApp never calls this

    given = str(node_config.get("cache-dir", "")) or None
    return Path(given) if given else user_cache()
