"""Node-local data on Flower: each SuperNode reads its own client's file; the server never touches data.

A ``[data]`` run on Flower goes as follows (docs/flower.md, "Node-local data"):

1. ``hello``: node ``i`` reads its client -- the file of its node config's ``data-path``, else the
   config's ``[data]`` source of client ``i`` (:func:`read_node`) -- holds out its own test part
   (:func:`fedmcmc.app.inputs.split_local`) and answers with its
   :class:`~fedmcmc.app.inputs.ClientSummary`: row counts, feature count and shape, its largest
   label, and the moments of its training inputs (count, sum, sum of squares), and of its
   regression targets. No row.
2. The server combines the summaries in client order (:func:`fedmcmc.app.inputs.combine`: the
   pooled feature and target scalings, the class count) into the run's :class:`~fedmcmc.app.inputs.Inputs`
   and sends them to every node (a ``nodes`` message): the nodes' standardisation exchange.
3. Server and nodes build the same run from ``Inputs`` alone (:func:`build_from_inputs`): the
   sampler sees the clients' counts, weights and layout through zeros of those shapes; a node
   puts its own scaled rows in its place (:func:`own_data`), exactly as the simulator's
   :func:`fedmcmc.app.inputs.load_data` would.

4. What the simulator computes from the data before the sampler's rounds -- the federated mode,
   ``step_size = "auto"``, the Laplace approximation, the whitening -- the server computes from
   the nodes' answers to ``ask`` rounds (:mod:`fedmcmc.app.flower.asks`), then sends every node
   the results its build needs (a second ``nodes`` message).

Pooled samplers, and CG-DSGLD's ``step_size = "auto"`` (its surrogates' local fits at the mode),
are refused (:func:`refused`, :func:`check_sampler`).
"""

from __future__ import annotations

import inspect
import json
import tomllib
from functools import lru_cache

import jax.numpy as jnp
import numpy as np

from fedmcmc.app import config as config_lib
from fedmcmc.app import inputs as inputs_lib
from fedmcmc.runtime.messaging.client import config_hash
from fedmcmc.core.base import ClientData
from fedmcmc.data import local
from fedmcmc.data import federated
from fedmcmc.data.federated import FederatedData
from fedmcmc.samplers import REGISTRY

def refused(name: str) -> str | None:
    """Why a node-local ``[data]`` run refuses registered sampler ``name``, or None: a pooled
    sampler (:attr:`fedmcmc.samplers.Registered.pooled`) is."""
    if REGISTRY[name].pooled:
        return "it is centralised: all data on one client"
    return None


def num_clients(section: dict) -> int:
    """The client count of a ``[data]`` section, known without reading a file: ``len(files)``,
    or the ``partition``'s ``num_clients``."""
    if "partition" in section and isinstance(section["partition"], dict) and "num_clients" in section["partition"]:
        return int(section["partition"]["num_clients"])
    files = section.get("files")
    if isinstance(files, list) and files and not any(_leaf(section, f) for f in files):
        return len(files)
    raise ValueError("[data] on Flower needs files = [...] (one per client; a node's data-path replaces its "
                     "entry, and a LEAF file is named per user as {file = ..., user = ...}) or a partition with "
                     "num_clients")


def _leaf(section: dict, source) -> bool:
    """Whether ``source`` names a whole LEAF file (its users are clients); a mere name is not."""
    try:
        return not isinstance(source, dict) and local.file_format(section, source) == "leaf"
    except ValueError:
        return False


def read_node(section: dict, index: int, data_path: str | None, base_dir) -> local.LocalData:
    """Client ``index``'s data on its node: the file ``data-path`` of the node config if given,
    else the ``[data]`` section's client ``index`` (relative paths from ``base_dir``)."""
    if data_path:
        return local.read_client(section, data_path, base_dir)
    if "files" in section:
        return local.read_client(section, section["files"][index], base_dir)
    return local.read_clients(section, base_dir)[index]


_LOCAL: dict[tuple, tuple] = {}


@lru_cache(maxsize=8)
def parsed(text: str) -> dict:
    """A run's config text, parsed and checked (cached: every message of a run carries its text)."""
    cfg = tomllib.loads(text)
    config_lib.validate(cfg)
    return cfg


def base_dir(node):
    """Where the config's relative paths start on this node (``node``: its
    :class:`~fedmcmc.app.flower.replies.NodeView` or Flower ``Context``): the run config's ``data-dir``."""
    return str(node.run_config.get("data-dir", "")) or None


def node_local(text: str, index: int, node) -> tuple:
    """``(train, test, summary)`` of this node's own client of a ``[data]`` run (read once per
    process): the file of its node config's ``data-path``, else the config's client ``index``."""
    path = str(node.node_config.get("data-path", "")) or None
    key = (config_hash(text), index, path)
    if key not in _LOCAL:
        section = parsed(text)["data"]
        b = num_clients(section)
        if not 0 <= index < b:
            raise ValueError(f"partition id {index} out of range for {b} clients; start node i with "
                             "--node-config 'partition-id=i' for i in 0..num_clients-1")
        data = read_node(section, index, path, base_dir(node))
        _LOCAL[key] = inputs_lib.split_local(section, index, data)
    return _LOCAL[key]


def _moments_to_json(m: local.Moments | None) -> list | None:
    return None if m is None else [m.count, np.asarray(m.total).tolist(), np.asarray(m.total_sq).tolist()]


def _moments_from_json(m: list | None) -> local.Moments | None:
    return None if m is None else local.Moments(int(m[0]), np.asarray(m[1], np.float64), np.asarray(m[2], np.float64))


def summary_to_json(summary: inputs_lib.ClientSummary) -> str:
    """A summary as JSON (float64 moments of the inputs and the target exactly: JSON floats are ``repr``)."""
    return json.dumps({**summary._asdict(), "moments": _moments_to_json(summary.moments),
                       "target_moments": _moments_to_json(summary.target_moments)})


def summary_from_json(text: str) -> inputs_lib.ClientSummary:
    s = json.loads(text)
    return inputs_lib.ClientSummary(**{**s, "moments": _moments_from_json(s["moments"]),
                                       "target_moments": _moments_from_json(s["target_moments"])})


def inputs_from_json(text: str) -> inputs_lib.Inputs:
    d = json.loads(text)
    return inputs_lib.Inputs(**{**d, "clients": tuple(d["clients"])})


def _label_dtype(info: inputs_lib.Inputs):
    return np.float32 if info.task == "regression" else np.int32


def check_sampler(cfg: dict) -> None:
    """Refuse a sampler that :func:`refused` names (a ``[data]`` run on Flower), naming those that
    work, and CG-DSGLD's ``step_size = "auto"``, whose conducive curvature fits every client's
    surrogate at the mode in one process."""
    name = config_lib.sampler_name(cfg)
    why = refused(name)
    if why:
        usable = [s for s in REGISTRY if not refused(s)]
        raise config_lib.ConfigError(f"{name} cannot run on node-local data: {why}; use one of "
                                     f"{', '.join(usable)} (docs/flower.md)")
    if cfg["sampler"].get("step_size") == "auto" and "surrogate" in inspect.signature(REGISTRY[name].build).parameters:
        raise config_lib.ConfigError(f'{name} with step_size = "auto" cannot run on node-local data yet: its '
                                     "conducive curvature fits every client's surrogate at the mode in one process; "
                                     "give a number (docs/design.md, \"Step sizes\")")


def build_from_inputs(cfg: dict, info: inputs_lib.Inputs, base_dir=None, federation=None,
                      known: str | None = None) -> config_lib.Built:
    """The run of a ``[data]`` config built from what the nodes told (``info``), without data: the
    clients' training parts are zeros of their shapes (the sampler needs only counts and shapes).
    ``tests`` is None: the held-out parts stay on the nodes. The server's estimators ask the nodes
    (``federation``, :class:`fedmcmc.app.flower.asks.Remote`); a node builds the server's run from
    its results (``known``, :func:`fedmcmc.app.flower.asks.known`), asking no one."""
    from fedmcmc.app.flower import asks

    check_sampler(cfg)
    mode, given = (None, {}) if known is None else asks.from_known(known)
    return config_lib.build_run(cfg, _zeros(info), inputs_lib.model_from_config(cfg, info, base_dir), None, None,
                                info, mode=mode, federation=asks.Refused() if federation is None else federation,
                                known=given)


def _zeros(info: inputs_lib.Inputs) -> FederatedData:
    """Zeros in the layout of the clients' training parts (the layout depends on the counts only)."""
    counts = [c["n_train"] for c in info.clients]
    return federated.zeros(counts, (np.zeros(tuple(info.input_shape), np.float32), np.zeros((), _label_dtype(info))))


def own_data(train: local.LocalData, index: int, info: inputs_lib.Inputs) -> ClientData:
    """A node's own training part, scaled (inputs, and a regression target) and in its rows of the
    run's layout as :func:`fedmcmc.app.inputs.load_data` packs it (the other clients' rows zeros),
    with a leading client axis of one (``ClientRuntime(data_fn=...)``)."""
    if len(train.y) != info.clients[index]["n_train"] or list(train.x.shape[1:]) != list(info.input_shape):
        raise RuntimeError(f"client {index}: its data changed since it greeted the server; restart the run")
    data = _zeros(info)
    x, y = data.x
    start = int(data.starts[index])
    x[start:start + len(train.y)] = local.apply_scaling(train.x, local.scaling_from(info.scaling))
    target = local.scaling_from(info.target_scaling)
    y[start:start + len(train.y)] = train.y if target is None else local.apply_scaling(train.y, target)
    return data.clients().take(jnp.asarray([index]))


def check_columns(summaries, names) -> None:
    """Refuse nodes whose CSV columns differ from the first node's (named; shapes are checked at hello)."""
    first = summaries[0]
    for s, name in zip(summaries[1:], names[1:]):
        if s.feature_names and first.feature_names and s.feature_names != first.feature_names:
            raise RuntimeError(f"{name} has the columns {s.feature_names}, {names[0]} {first.feature_names}; "
                               "every node's data needs the same columns in the same order")
