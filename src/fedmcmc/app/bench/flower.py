"""``fedmcmc bench --flower``: deployment rounds and per-message client processes on Flower.

One loopback deployment (a SuperLink and 3 SuperNodes on 127.0.0.1, no TLS, started by
:class:`fedmcmc.app.flower.launch.LocalDeployment`, the launcher of ``fedmcmc flower deploy``)
runs, one after the other (ours and the echoes alternating):

* our QLSD++ and FA-HMC (the examples' samplers, 3 clients), with their ``median_round_seconds``
  and ``median_client_process_seconds`` (seconds from a ClientApp process's start to its round
  reply) from ``results.json``, both with the default ``[flower] hold = false``, and QLSD++ again
  with ``hold`` messages (``hold = true``, docs/flower.md); each SuperNode has a node worker
  (:mod:`fedmcmc.app.flower.node_worker`), as under ``fedmcmc flower deploy``;
* a trivial echo app (``flwr_echo/``) on Flower's default loop (``Grid.send_and_receive``),
  sending and answering arrays of the bytes of our QLSD++ round's message and reply;
* the same echo app whose ClientApp imports JAX and runs one operation before answering;

and then, on a second deployment whose SuperNodes have no node worker (each ClientApp process
answers by itself), our QLSD++ again.

``flower_round_ratio`` is our slower median round over the echo's (target <= 0.5) and
``flower_client_process_ratio`` our slower median client process over the JAX echo's (target
<= 1.3). docs/benchmarks.md says what limits both (docs/flower.md, "Latency per round").
"""

from __future__ import annotations

import json
from pathlib import Path

from fedmcmc.app.bench import secure_aggregation
from fedmcmc.app.flower.launch import NODE_ENV, LocalDeployment

ECHO_DIR = Path(__file__).parent / "flwr_echo"
CLIENTS = 3
TARGETS = {"flower_round_ratio": 0.5, "flower_client_process_ratio": 1.3}

_PROBLEM = f"""[problem]
name = "heterogeneous-gaussian"
num_clients = {CLIENTS}
dim = 10
"""
_RUN = """[run]
seed = 0
num_chains = 2
num_iterations = {rounds}
chunk_size = {rounds}
[flower]
round_timeout = 300
"""
#: The samplers of examples/flower_qlsd_pp.toml and examples/flower_fa_hmc.toml.
SAMPLERS = {
    "qlsd++": """[sampler]
name = "qlsd++"
step_size = 1e-3
batch_size = 10
compression = { bits = 8 }
refresh_every = 5
""",
    "fa-hmc": """[sampler]
name = "fa-hmc"
step_size = 0.002
num_leapfrog = 5
local_steps = 50
clock = "leapfrog"
correlation = 1.0
compression = { bits = 8 }
""",
}


def _median(values) -> float:
    values = sorted(values)
    return float(values[len(values) // 2])


def _ours(dep: LocalDeployment, out: Path, name: str, rounds: int, hold: bool = False) -> dict:
    label = f"{name}-hold" if hold else name if dep.workers else f"{name}-no-worker"
    path = out / f"{label}.toml"
    path.write_text(_PROBLEM + SAMPLERS[name] + _RUN.format(rounds=rounds) + f"hold = {str(hold).lower()}\n")
    flower = dep.run(path, out / label, timeout=3600)["flower"]
    return {k: flower[k] for k in ("median_round_seconds", "max_round_seconds", "median_client_process_seconds",
                                   "median_round_message_bytes", "median_round_reply_bytes", "missing_replies")}


def _echo(dep: LocalDeployment, out: Path, rounds: int, message: int, reply: int, import_jax: bool) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    for old in ("results.json", "flower-done.txt"):
        (out / old).unlink(missing_ok=True)
    config = out / "flower-run.toml"
    config.write_text(f"out = {json.dumps(str(out))}\nnodes = {CLIENTS}\nrounds = {rounds}\n"
                      f"message-bytes = {message}\nreply-bytes = {reply}\nimport-jax = {str(import_jax).lower()}\n")
    dep.flwr_run(ECHO_DIR, config)
    got = dep.wait(out / "results.json", timeout=3600)
    return {"median_round_seconds": _median(got["round_seconds"]), "max_round_seconds": max(got["round_seconds"]),
            "median_client_process_seconds": _median(got["process_seconds"])}


def run(out, quick: bool = False, rounds: int | None = None) -> dict:
    """Measure on a loopback deployment (module docstring); ``rounds`` per run (default 12, 5 if ``quick``).
    Returns ``flower_round_ratio`` and ``flower_client_process_ratio`` with their targets, and the
    measurements behind them under ``flower``."""
    rounds = rounds or (5 if quick else 12)
    out = Path(out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    with LocalDeployment(CLIENTS, out / "deployment") as dep:
        ours = {"qlsd++": _ours(dep, out, "qlsd++", rounds)}  # ours and the echoes alternate (load drifts)
        sizes = int(ours["qlsd++"]["median_round_message_bytes"]), int(ours["qlsd++"]["median_round_reply_bytes"])
        echo = _echo(dep, out / "echo", rounds, *sizes, import_jax=False)
        ours["fa-hmc"] = _ours(dep, out, "fa-hmc", rounds)
        echo_jax = _echo(dep, out / "echo-jax", rounds, *sizes, import_jax=True)
        with_hold = _ours(dep, out, "qlsd++", rounds, hold=True)
        secure = secure_aggregation.deployment(dep, out, _PROBLEM, _RUN, rounds)  # secure aggregation's round, plain and secure
    with LocalDeployment(CLIENTS, out / "deployment-no-worker", workers=False) as dep:
        without_worker = _ours(dep, out, "qlsd++", rounds)
    round_ratio = max(o["median_round_seconds"] for o in ours.values()) / echo["median_round_seconds"]
    process_ratio = (max(o["median_client_process_seconds"] for o in ours.values())
                     / echo_jax["median_client_process_seconds"])
    return {
        **secure,
        "flower_round_ratio": round_ratio, "flower_round_ratio_target": TARGETS["flower_round_ratio"],
        "flower_client_process_ratio": process_ratio,
        "flower_client_process_ratio_target": TARGETS["flower_client_process_ratio"],
        "flower": {**ours, "qlsd++_with_hold": with_hold, "qlsd++_without_node_worker": without_worker,
                   "echo_default_loop": echo, "echo_importing_jax": echo_jax,
                   "settings": {"supernodes": CLIENTS, "rounds": rounds, "tls": False, "node_env": NODE_ENV,
                                "node_workers": True,
                                "message_bytes": sizes[0], "reply_bytes": sizes[1]}},
    }
