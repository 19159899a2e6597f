"""The server's estimators over Flower: the ``ask`` exchange of a ``[data]`` run, and what the
nodes are told of its results.

Before the sampler's rounds, a Flower server of node-local data runs every estimator the
simulator runs (the federated mode, the curvature of ``step_size = "auto"``, the heterogeneity,
the minibatch noise, the Laplace approximation of the starting points, the whitening and the
posterior check) against :class:`Remote`: each of their rounds is an ``ask`` message to every node
(:data:`fedmcmc.estimators.federation.COMPUTATIONS`: a name and the broadcast arrays), which
:meth:`Node.answer` computes on the node's own rows with the simulator's program
(:func:`fedmcmc.estimators.federation.program`, ``b`` copies of itself under ``[flower] exact``), so
that every number is the simulator's, bit for bit. The nodes then receive what their own build of
the run needs (:func:`known`: the mode, the step's record, the whitening), and nothing of another
client. ``results.json``'s ``flower`` entry counts the asks (``ask_rounds``, ``ask_bytes_down``,
``ask_bytes_up``: the arrays sent and received).
"""

from __future__ import annotations

import json

import numpy as np

from fedmcmc.estimators import federation as federation_lib
from fedmcmc.estimators.gradients import ModeResult
from fedmcmc.models.whitened import Whitening


class Remote:
    """The nodes of a Flower run as a :class:`~fedmcmc.estimators.federation.Federation`: an
    ``ask`` is one exchange over ``transport`` (:class:`fedmcmc.app.flower.grid.GridTransport`)
    with every client; a client that does not answer stops the run, naming it (every estimator
    needs every client's answer)."""

    def __init__(self, transport, counts):
        self.transport, self.num_clients, self.counts = transport, transport.b, np.asarray(counts)
        self.stats = {"ask_rounds": 0, "ask_bytes_down": 0, "ask_bytes_up": 0}

    def ask(self, name: str, *args):
        if name not in federation_lib.COMPUTATIONS:
            raise ValueError(f"unknown computation {name!r}")
        message = {"kind": "ask", "name": name, "args": list(federation_lib.as_arguments(args))}
        replies = self.transport.exchange({i: message for i in range(self.num_clients)},
                                          self.transport.flower.round_timeout)
        missing = [i for i, r in replies.items() if r is None or "answer" not in r]
        if missing:
            raise RuntimeError(f"client(s) {missing} did not answer the server's {name!r} round (the run's mode, "
                               "step or approximation needs every client); see their SuperNodes' logs")
        answers = [[np.reshape(a, shape) for a, shape in zip(replies[i]["answer"], replies[i]["shapes"])]
                   for i in range(self.num_clients)]
        self.stats["ask_rounds"] += 1
        self.stats["ask_bytes_down"] += self.num_clients * sum(a.nbytes for a in message["args"])
        self.stats["ask_bytes_up"] += sum(a.nbytes for answer in answers for a in answer)
        stacked = tuple(np.stack([answer[k] for answer in answers]) for k in range(len(answers[0])))
        return stacked if len(stacked) > 1 else stacked[0]


class Refused:
    """A node's federation: a node computes nothing of the run's setup for itself (the server
    tells it the results, :func:`known`); asking it is a bug, said as such."""

    num_clients = counts = None

    def ask(self, name: str, *args):
        raise RuntimeError(f"a node was asked for {name!r} while building its run: the server's results "
                           "(the mode, the step) did not reach it; restart the run")


class Node:
    """A node's side of the asks: its model and its own rows (``own``, a ``ClientData`` of one
    client in the run's layout, put on the device once), answered in a batch of ``width`` copies
    of itself (the simulator's batch of ``b`` under ``[flower] exact``), the programs compiled once."""

    def __init__(self, model, own, width: int):
        import jax
        import jax.numpy as jnp

        self.model, self.programs = model, {}
        self.rows = jax.tree_util.tree_map(jnp.asarray, own.rows)
        self.index = jnp.full((width,), int(np.asarray(own.index).reshape(-1)[0]), jnp.int32)

    def answer(self, m: dict) -> dict:
        """The answer to an ``ask``: computation ``m["name"]`` at ``m["args"]`` on the node's rows."""
        import jax

        name = str(m["name"])
        if name not in federation_lib.COMPUTATIONS:
            raise ValueError(f"unknown computation {name!r}")
        if name not in self.programs:
            self.programs[name] = federation_lib.program(self.model, name)
        out = self.programs[name](self.rows, federation_lib.as_arguments(m["args"]), self.index)
        rows = [np.asarray(np.asarray(a)[0]) for a in jax.tree_util.tree_leaves(out)]
        return {"answer": rows, "shapes": [list(a.shape) for a in rows]}  # Flower's arrays have at least one axis


def _mode_to_json(mode: ModeResult | None):
    if mode is None:
        return None
    return {"theta": np.asarray(mode.theta, np.float32).tolist(),
            "client_grad_sum": np.asarray(mode.client_grad_sum, np.float32).tolist(),
            "gradient_norm": float(mode.gradient_norm), "rounds": int(mode.rounds), "bits": int(mode.bits)}


def _mode_from_json(d) -> ModeResult | None:
    import jax.numpy as jnp

    if d is None:
        return None
    return ModeResult(jnp.asarray(d["theta"], jnp.float32), jnp.asarray(d["client_grad_sum"], jnp.float32),
                      d["gradient_norm"], d["rounds"], d["bits"])


def _plain(value):
    """A record's numbers as JSON's (NumPy scalars and arrays as floats and lists)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def known(built) -> str:
    """What a node's build of the server's run needs of the server's results, as JSON (floats
    exactly): the mode (``theta*`` and the clients' sum there; not any client's own gradient), the
    step's record, and when the sampler runs whitened, the map ``(theta*, L)`` and the mode in ``z``."""
    from fedmcmc.app import whiten

    w = built.whitening[0]
    out = {"mode": _mode_to_json(built.mode), "step": _plain(built.step)}
    if w is not None:
        out.update(whitening=[np.asarray(w.centre).tolist(), np.asarray(w.factor).tolist(), str(np.asarray(w.factor).dtype)],
                   mode_in_z=_mode_to_json(None if built.mode is None else whiten.mode_in_z(built.model, built.mode, w)))
    return json.dumps(out)


def from_known(text: str) -> tuple[ModeResult | None, dict]:
    """``(mode, known)`` for :func:`fedmcmc.app.config.build_run` from :func:`known`'s JSON."""
    d = json.loads(text)
    out = {}
    if d["step"].get("rule") != "given":
        out["step"] = d["step"]
    out["whitening"] = None  # the server's decision, whatever the node's config would say
    if "whitening" in d:
        centre, factor, dtype = d["whitening"]
        out.update(whitening=Whitening(np.asarray(centre, dtype), np.asarray(factor, dtype)),
                   mode_in_z=_mode_from_json(d["mode_in_z"]))
    return _mode_from_json(d["mode"]), out
