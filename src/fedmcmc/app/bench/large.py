"""``federation_overhead_large``: what a QLSD++ round costs on top of its own gradients, large models.

The models are those of the BNN study (:mod:`fedmcmc.app.studies.qlsd_bnn_heterogeneous`) at the
paper's image size (28x28 MNIST-5k, 20 dominant-label clients): the MLP 784-100-10
(d = 79,510) and LeNet-5 (d = 61,706). The sampler is the study's QLSD++ (minibatches of
``batch_size // 2`` points per client, SVRG anchor refreshed every ``refresh_every`` rounds,
memory terms) with 8-bit QSGD (``s = 256``), full participation, one chain.

The ratio, per model, is the wall time of ``rounds`` QLSD++ rounds (:func:`fedmcmc.simulate`,
compilation excluded) over that of **the same gradients alone**: a compiled loop over the same
rounds in which every client runs the study's SVRG estimator
(:func:`fedmcmc.estimators.svrg.svrg`) exactly as in QLSD++ -- the same minibatch sampling
without replacement, the same two minibatch gradients (at ``theta_k`` and at the anchor), the
same exact local gradient at every anchor refresh -- and the server only adds the 20 estimates
and takes a plain gradient step (no compression, no bit count, no memory, no noise, nothing
recorded). Everything else a QLSD++ round does (quantisation, the exact QSGD bit count,
dequantisation, memory terms, the Langevin move, recording) is the federation's overhead.
Target: ``<= 1.3`` (docs/benchmarks.md, "Targets"), the ``ratio`` of each model's entry. Both loops run
in this process, interleaved, best of ``repeats``.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.app.studies import qlsd_bnn_heterogeneous as bnn
from fedmcmc.core import xla
from fedmcmc.core.base import CLIENT_AXES
from fedmcmc.estimators.svrg import svrg
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers.qlsd_pp import QLSDPPBroadcast

TARGET = 1.3
MODELS = {"mlp": dict(model="mlp", hidden=[100]), "lenet5": dict(model="lenet5")}
SETTING = dict(bnn.FULL, image_size=28, levels=256, num_chains=1)


def gradients_alone(model, data, batch_size: int, refresh_every: int, step_size: float, rounds: int):
    """``run(key, theta0) -> theta``: ``rounds`` rounds of the QLSD++ clients' SVRG gradients only
    (module docstring), compiled once."""
    estimator = svrg(model, batch_size, refresh_every, stale_clients=False)
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())  # the rows gathered by traced indices
    num_clients = data.num_clients

    def round_(carry, k):
        key, theta, states = carry
        key, sub = jax.random.split(key)
        broadcast = QLSDPPBroadcast(theta, theta)
        grads, states = jax.vmap(estimator.estimate, in_axes=(0, 0, None, CLIENT_AXES, None))(
            jax.random.split(sub, num_clients), states, broadcast, clients, k)
        return (key, theta - step_size * jnp.sum(grads, axis=0), states), None

    def run(key, theta0):
        theta0 = jnp.asarray(theta0, jnp.float32)
        states = jax.vmap(estimator.init, in_axes=(None, CLIENT_AXES))(QLSDPPBroadcast(theta0, theta0), clients)
        (_, theta, _), _ = jax.lax.scan(round_, (key, theta0, states), jnp.arange(rounds, dtype=jnp.int32))
        return theta

    return xla.jit(run)


def overhead(name: str, rounds: int, repeats: int = 2) -> dict:
    """Seconds per round of QLSD++ and of its gradients alone for the study's model ``name``."""
    cfg = dict(SETTING, **MODELS[name], iterations=rounds)
    prob = bnn.problem(cfg)
    data = prob["data"]
    model, layout = bnn.build_model(cfg, prob["num_classes"])
    theta0 = np.asarray(layout.init(jax.random.PRNGKey(cfg["seed"])))
    sampler = bnn.samplers(cfg, model, data)["QLSD++"][0]
    half = max(1, int(cfg["batch_size"]) // 2)
    alone = gradients_alone(model, data, half, int(cfg["refresh_every"]), cfg["lr"] / data.total, rounds)

    def qlsd_pp(seed):
        simulate(seed, sampler, data, theta0, rounds, chunk_size=rounds, workers=1)

    def grads(seed):
        jax.block_until_ready(alone(jax.random.PRNGKey(seed), theta0))

    best = {"qlsd_pp": float("inf"), "gradients": float("inf")}
    for r in range(repeats + 1):  # the first pass compiles
        for label, fn in (("qlsd_pp", qlsd_pp), ("gradients", grads)):
            t = time.perf_counter()
            fn(r)
            if r:
                best[label] = min(best[label], time.perf_counter() - t)
    return {"qlsd_pp_seconds_per_round": best["qlsd_pp"] / rounds,
            "gradients_alone_seconds_per_round": best["gradients"] / rounds,
            "ratio": best["qlsd_pp"] / best["gradients"], "target": TARGET,
            "settings": {"model": model.name, "dim": model.dim, "clients": data.num_clients,
                         "points": data.total, "levels": cfg["levels"], "batch_size": half,
                         "refresh_every": cfg["refresh_every"], "chains": 1, "rounds": rounds}}


def run(quick: bool = False) -> dict:
    """``{model: overhead(model)}`` for the MLP and LeNet-5 (20 rounds quick, else 40: two anchor
    refreshes)."""
    rounds = 20 if quick else 40
    return {name: overhead(name, rounds) for name in MODELS}
