"""`fedmcmc bench`'s accelerator section: the device JAX runs on and what spreading chains over
several local devices gives (:mod:`fedmcmc.runtime.devices`).

With more than one local device (GPUs, TPUs), ``spread_speedup`` is the chain-iterations per
second of QLSD* with :data:`CHAINS` chains spread over every device, over the same chains on one
device, measured interleaved (best of ``repeats``); ``spread_draws_identical`` checks that both
gave the same draws bit for bit. On an accelerator it also records QLSD* with
:data:`MANY_CHAINS` chains. On CPU (one device: chains go to worker processes instead) only the
device facts are recorded.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from fedmcmc.runtime import devices
from fedmcmc.runtime.simulator import simulate

CHAINS = 30
MANY_CHAINS = 1_000


def _best_seconds(runs: dict, repeats: int) -> dict:
    """Best wall time of each ``label -> run(seed)``, compiled first, the runs interleaved."""
    for run in runs.values():
        run(0)
    best = dict.fromkeys(runs, float("inf"))
    for r in range(repeats):
        for label, run in runs.items():
            t = time.perf_counter()
            run(r + 1)
            best[label] = min(best[label], time.perf_counter() - t)
    return best


def measure(sampler, data, iterations: int, repeats: int = 3) -> dict:
    """Device facts and, with several local devices, the spread ratio (module docstring).

    Parameters
    ----------
    sampler, data
        The bench's QLSD* and its toy problem.
    iterations
        Rounds per timed run.
    repeats
        Timed runs of each setting (the best counts).
    """
    facts = devices.facts()
    out = {**facts, "spread_speedup": None, "spread_speedup_target": facts["count"],
           "spread_draws_identical": None, f"qlsd_star_{MANY_CHAINS}_chains_chain_iterations_per_second": None,
           "settings": {"chains": CHAINS, "many_chains": MANY_CHAINS, "iterations": iterations, "repeats": repeats}}
    run = partial(simulate, sampler=sampler, data=data, theta0=np.zeros(data.x.shape[-1]),
                  num_iterations=iterations, chunk_size=iterations)
    if facts["platform"] == "cpu":  # chains over CPU cores are the worker processes, measured above
        return out
    if facts["count"] > 1:
        one, spread = (partial(run, num_chains=CHAINS, devices=n) for n in (1, facts["count"]))
        best = _best_seconds({"one": one, "spread": spread}, repeats)
        out["spread_speedup"] = best["one"] / best["spread"]
        out["spread_draws_identical"] = bool(np.array_equal(one(0).samples, spread(0).samples))
    many = _best_seconds({"many": partial(run, num_chains=MANY_CHAINS)}, repeats)["many"]
    out[f"qlsd_star_{MANY_CHAINS}_chains_chain_iterations_per_second"] = MANY_CHAINS * iterations / many
    return out
