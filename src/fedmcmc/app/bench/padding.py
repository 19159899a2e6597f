"""`fedmcmc bench`'s padding tax: full-batch federated rounds on unbalanced clients against
pooled ULA on the same points (docs/benchmarks.md, "No padding tax").

``padding_overhead_full_batch`` is the seconds per iteration of QLSD# (identity compression,
full participation, exact local gradients) on the toy problem's 20 unbalanced clients (14 to
192 points, 2,042 in all) over those of ULA (SGLD with full batches) on the pooled points,
30 chains in one process, the two interleaved and the best of ``repeats`` kept for each.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from fedmcmc.compression import identity
from fedmcmc.data.synthetic import heterogeneous_gaussian
from fedmcmc.models.gaussian import gaussian_mean
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers import qlsd_sharp, sgld

TARGET = 1.2
STEP = 4.9e-4


def padding_overhead(chains: int = 30, iterations: int = 10_000, repeats: int = 5, data=None) -> dict:
    """``padding_overhead_full_batch`` with its target, the two rates and the settings.

    Parameters
    ----------
    chains, iterations
        Chains and rounds of each timed run (compiled once before).
    repeats
        Timed runs of each, alternating federated and pooled.
    data
        The clients (default the toy problem, :func:`~fedmcmc.data.synthetic.heterogeneous_gaussian`).
    """
    data = heterogeneous_gaussian() if data is None else data
    dim = int(data.x.shape[-1])
    model = gaussian_mean(dim)
    runs = {"federated": (qlsd_sharp(model, STEP, None, identity()), data),
            "pooled": (sgld(model, STEP, None), data.pooled())}
    timed = {name: partial(simulate, sampler=s, data=d, theta0=np.zeros(dim), num_iterations=iterations,
                           num_chains=chains, chunk_size=iterations, workers=1) for name, (s, d) in runs.items()}
    best = {name: float("inf") for name in timed}
    for name, run in timed.items():
        run(0)  # compile
    for r in range(repeats):
        for name, run in timed.items():
            t = time.perf_counter()
            run(r + 1)
            best[name] = min(best[name], time.perf_counter() - t)
    rate = {name: chains * iterations / seconds for name, seconds in best.items()}
    rows = int(np.shape(data.x)[0])
    return {"padding_overhead_full_batch": rate["pooled"] / rate["federated"], "target": TARGET,
            "qlsd_identity_full_batch_chain_iterations_per_second": rate["federated"],
            "ula_pooled_chain_iterations_per_second": rate["pooled"],
            "settings": {"clients": data.num_clients, "points": data.total, "rows_stored": rows,
                         "buckets": len(data.groups), "dim": dim, "chains": chains, "iterations": iterations,
                         "repeats": repeats}}
