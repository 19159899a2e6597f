"""QLSD++ on Fashion-MNIST split over 1,000 clients by Dirichlet(0.1): memory and rate
(docs/design.md, "Packed buckets").

``python benchmarks/no_padding_fmnist.py [ROUNDS]``. The 60,000 training images (28x28 in [0, 1])
go to 1,000 clients by Hsu et al.'s per-class Dirichlet(0.1) proportions, after one random image
to each client (with 1,000 clients and alpha = 0.1 most draws leave some client empty). Model: an
MLP 784-10-10 (d = 7,960; the exact QSGD bit count of 1,000 clients x d
entries a round is target 2's), prior N(0, I). QLSD++: QSGD with s = 2, minibatches of 10 per
client, a full local gradient every 20 rounds (the SVRG refresh), 1 chain. Prints the layout
(rows stored against b * n_max), the rounds per second after compilation, the seconds XLA spent
compiling (and tracing and lowering) and the peak RSS.
"""
import resource
import sys
import time

import numpy as np
from jax import monitoring

from fedmcmc.compression import quantization
from fedmcmc.data import load_dataset, partition
from fedmcmc.data.federated import from_clients
from fedmcmc.models import mlp
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers import qlsd_pp

CLIENTS, ALPHA, BATCH, REFRESH, HIDDEN = 1000, 0.1, 10, 20, 10


def _count(spent: dict, event: str, seconds: float) -> None:
    if event.endswith("backend_compile_duration"):
        spent["compile"] += seconds
    elif event.endswith(("jaxpr_trace_duration", "jaxpr_to_mlir_module_duration")):
        spent["trace"] += seconds


def split(seed: int, labels) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    first = rng.permutation(labels.size)[:CLIENTS]
    rest = np.setdiff1d(np.arange(labels.size), first)
    parts = partition.dirichlet(seed, labels[rest], CLIENTS, ALPHA, min_size=0)
    return [np.concatenate([[f], rest[p]]) for f, p in zip(first, parts)]


def main(rounds: int) -> dict:
    spent = {"compile": 0.0, "trace": 0.0}
    monitoring.register_event_duration_secs_listener(lambda event, seconds, **_: _count(spent, event, seconds))
    d = load_dataset("fashion-mnist")
    parts = split(0, d.y)
    data = from_clients([(d.x[p], d.y[p]) for p in parts])
    del d
    counts = np.asarray(data.counts)
    model = mlp(784, (HIDDEN,), 10)
    sampler = qlsd_pp(model, 1e-6, BATCH, quantization(2), refresh_every=REFRESH)
    theta0 = np.random.default_rng(1).normal(0, 0.05, model.dim)
    run = dict(sampler=sampler, data=data, theta0=theta0, num_chains=1, workers=1)
    t = time.perf_counter()
    simulate(0, num_iterations=REFRESH, chunk_size=REFRESH, **run)  # compile
    compile_s = time.perf_counter() - t
    t = time.perf_counter()
    r = simulate(1, num_iterations=rounds, chunk_size=rounds, **run)
    seconds = time.perf_counter() - t
    out = {"clients": data.num_clients, "points": data.total, "n_min": int(counts.min()), "n_max": int(counts.max()),
           "n_median": float(np.median(counts)), "buckets": len(data.groups), "rows_stored": int(data.x[0].shape[0]),
           "rows_if_padded": data.num_clients * data.n_max, "dim": model.dim, "rounds": rounds,
           "rounds_per_second": rounds / seconds, "first_run_seconds": compile_s,
           "xla_compile_seconds": spent["compile"], "trace_and_lower_seconds": spent["trace"],
           "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
           "finite": bool(np.all(np.isfinite(np.asarray(r.samples))))}
    print(out)
    return out


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
