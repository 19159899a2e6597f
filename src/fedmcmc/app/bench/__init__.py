"""`fedmcmc bench`: throughput ratios measured in one run.

(a) ``speedup_vs_numpy``: chain-iterations per second of our QLSD* on the toy problem
    (30 chains, 4-bit quantisation, minibatches of N_i / 10) over those of a straightforward
    NumPy QLSD* that loops over clients every iteration (:mod:`fedmcmc.app.bench.numpy_reference`);
    the two timed in turn, each rate its best of three runs.
(b) ``federation_overhead``: seconds per iteration of our QLSD (identity compression, full
    participation, 20 clients) over our centralised SGLD with the same total minibatch.
(c) ``fa_hmc_overhead``: per-datum gradient evaluations per second of FA-HMC (20 clients,
    logistic regression, K = 10, T = 10) against centralised unadjusted HMC on the pooled data
    with the same K and T, i.e. the same gradient work per round.
(d) ``dsgld_overhead``: local Langevin steps per second of CG-DSGLD (10 shards of the Gaussian
    blobs, 200 local steps a visit, minibatches of 10) against centralised SGLD with the same
    minibatch on the pooled data; and ``dsgld_sparse_speedup``, the gain from stepping only
    the visited shard (``max_active = 1``) over stepping all shards and keeping one.
(e) ``chains_scale``: what 30 chains gain over 1 for every registered sampler
    (:mod:`fedmcmc.app.bench.chains`).
(f) ``federation_overhead_large``: a QLSD++ round (8-bit QSGD, 20 clients) over the same
    minibatch gradients alone, on the BNN study's MLP and LeNet-5 (:mod:`fedmcmc.app.bench.large`).
(g) ``secure_aggregation``: the upload bits and round time of QLSD++ with secure aggregation over
    the plain run, in process (:mod:`fedmcmc.app.bench.secure_aggregation`).
(h) ``no_padding_tax``: full-batch QLSD# on the toy problem's unbalanced clients against ULA on the
    pooled points, interleaved in one process (:mod:`fedmcmc.app.bench.padding`).
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.runtime import cpu, io
from fedmcmc.estimators import gradients
from fedmcmc.app import problems
from fedmcmc.app.bench import accelerator, flower as flower_bench, large, numpy_reference, secure_aggregation
from fedmcmc.app.bench.chains import chain_scaling
from fedmcmc.app.bench.padding import padding_overhead
from fedmcmc.compression import identity, quantization
from fedmcmc.data.synthetic import heterogeneous_gaussian, logistic_regression_data
from fedmcmc.models import logistic_regression
from fedmcmc.models.gaussian import gaussian_mean
from fedmcmc.samplers import cg_dsgld, fa_hmc, qlsd_sharp, qlsd_star, sgld
from fedmcmc.runtime.simulator import simulate

STEP = 4.9e-4
LEVELS = 16


def _timed_runs(sampler, data, chains, iterations, d=None, workers=None):
    """Compile the run, then return ``once(r)``: the seconds of one run with seed ``r + 1``
    (``workers``: as in :func:`fedmcmc.simulate`, default the number set by :func:`fedmcmc.tune_cpu`)."""
    d = data.x.shape[-1] if d is None else d
    run = partial(simulate, sampler=sampler, data=data, theta0=np.zeros(d), num_iterations=iterations,
                  num_chains=chains, chunk_size=iterations, workers=workers)
    run(0)  # compile

    def once(r: int) -> float:
        t = time.perf_counter()
        run(r + 1)
        return time.perf_counter() - t

    return once


def _rate(sampler, data, chains, iterations, repeats=3, d=None, workers=None) -> float:
    """Best of ``repeats`` chain-iterations per second, compilation excluded (:func:`_timed_runs`)."""
    once = _timed_runs(sampler, data, chains, iterations, d, workers)
    return chains * iterations / min(once(r) for r in range(repeats))


def _toy():
    data = heterogeneous_gaussian()
    model = gaussian_mean(data.x.shape[-1])
    batch = np.maximum(np.asarray(data.counts) // 10, 1)
    return data, model, batch, gradients.find_mode(model, data)


def fa_hmc_rates(chains: int, rounds: int, num_leapfrog: int = 10, local_steps: int = 10) -> dict:
    """Per-datum gradient evaluations per second, federated FA-HMC and centralised uHMC (exact
    gradients; ``local_steps`` trajectories of ``num_leapfrog`` steps per round)."""
    data, _ = logistic_regression_data(seed=0, dim=10, num_points=1000, num_clients=20)
    model = logistic_regression(10)
    work = (local_steps * num_leapfrog + 1) * data.total  # per-datum gradients per round and chain
    fed = _rate(fa_hmc(model, data.weights, 0.05, num_leapfrog, local_steps, clock="trajectory"), data, chains, rounds,
                d=10)
    central = _rate(fa_hmc(model, [1.0], 0.05, num_leapfrog, local_steps, clock="trajectory"), data.pooled(), chains,
                    rounds, d=10)
    return {"fa_hmc_gradients_per_second": fed * work, "centralised_uhmc_gradients_per_second": central * work,
            "settings": {"clients": data.num_clients, "points": data.total, "dim": model.dim, "chains": chains,
                         "rounds": rounds, "num_leapfrog": num_leapfrog, "local_steps": local_steps}}


def dsgld_rates(chains: int, rounds: int, local_steps: int = 200) -> dict:
    """Local Langevin steps per second: CG-DSGLD (sparse and dense execution) and centralised SGLD."""
    data, model, _ = problems.gaussian_blobs()
    f = np.full(data.num_clients, 1.0 / data.num_clients)
    sparse = cg_dsgld(model, f, 1e-4, local_steps, batch_size=10)
    dense = sparse._replace(participation=sparse.participation._replace(max_active=None))
    steps = rounds * local_steps
    return {"cg_dsgld_steps_per_second": _rate(sparse, data, chains, rounds, d=2) * local_steps,
            "cg_dsgld_dense_steps_per_second": _rate(dense, data, chains, rounds, d=2) * local_steps,
            "sgld_steps_per_second": _rate(sgld(model, 5e-5, 10), data.pooled(), chains, steps, d=2),
            "settings": {"shards": data.num_clients, "points": data.total, "chains": chains, "rounds": rounds,
                         "local_steps": local_steps, "batch_size": 10}}


def run(out: Path, quick: bool = False, flower: bool = False) -> dict:
    data, model, batch, mode = _toy()
    iters = 2_000 if quick else 10_000
    numpy_iters = 500 if quick else 3_000

    star = qlsd_star(model, STEP, mode, batch, quantization(LEVELS))
    clients = [data.unpadded(i).astype(np.float64) for i in range(data.num_clients)]

    def numpy_seconds(r: int) -> float:
        t = time.perf_counter()
        numpy_reference.qlsd_star(np.random.default_rng(r), clients, np.asarray(mode.theta, np.float64),
                                  np.asarray(mode.client_grad_sum, np.float64), STEP, LEVELS, batch.tolist(),
                                  np.zeros(model.dim), numpy_iters)
        return time.perf_counter() - t

    # ours and the NumPy reference in turn, the best of three each: side by side, so that the
    # machine's drift (the reference alone moved 20% within a minute here) reaches both
    ours_once, ours_s, numpy_s = _timed_runs(star, data, 30, iters), [], []
    for r in range(3):
        ours_s.append(ours_once(r))
        numpy_s.append(numpy_seconds(r))
    ours, numpy_rate = 30 * iters / min(ours_s), numpy_iters / min(numpy_s)
    ours_one = _rate(star, data, 1, iters)
    ours_one_process = _rate(star, data, 30, iters, workers=1)

    fed = _rate(qlsd_sharp(model, STEP, batch, identity()), data, 30, iters)
    central = _rate(sgld(model, STEP, int(batch.sum())), data.pooled(), 30, iters)
    fa = fa_hmc_rates(20, 20 if quick else 100)
    ds = dsgld_rates(20, 50 if quick else 200)
    payload = {
        "quick": quick,
        "workers": cpu.default_workers(),
        "devices": accelerator.measure(star, data, iters),
        "qlsd_star_chain_iterations_per_second": {"ours_30_chains": ours, "ours_30_chains_one_process": ours_one_process,
                                                   "ours_1_chain": ours_one, "numpy_reference_1_chain": numpy_rate},
        "speedup_vs_numpy": ours / numpy_rate,
        "speedup_vs_numpy_target": 100,
        "speedup_vs_numpy_one_process": ours_one_process / numpy_rate,
        "federation": {"qlsd_identity_chain_iterations_per_second": fed,
                       "sgld_same_total_minibatch_chain_iterations_per_second": central},
        "federation_overhead": central / fed,
        "fa_hmc": fa,
        "fa_hmc_overhead": fa["centralised_uhmc_gradients_per_second"] / fa["fa_hmc_gradients_per_second"],
        "dsgld": ds,
        "dsgld_overhead": ds["sgld_steps_per_second"] / ds["cg_dsgld_steps_per_second"],
        "dsgld_sparse_speedup": ds["cg_dsgld_steps_per_second"] / ds["cg_dsgld_dense_steps_per_second"],
        "chains_scale": chain_scaling(0.25 if quick else 1.0),
        "federation_overhead_large": large.run(quick),
        "secure_aggregation": secure_aggregation.run(Path(out) / "secagg", quick),
        "no_padding_tax": padding_overhead(iterations=iters, repeats=5 if quick else 7),  # docs/benchmarks.md, "No padding tax"
        "settings": {"clients": data.num_clients, "dim": model.dim, "levels": LEVELS, "batch": batch.tolist(),
                     "iterations": iters, "numpy_iterations": numpy_iters, "chains": 30},
    }
    if flower:  # deployment rounds and client processes on Flower (fedmcmc.app.bench.flower)
        payload.update(flower_bench.run(Path(out) / "flower", quick))
    io.write_json(Path(out) / "bench.json", payload)
    return payload
