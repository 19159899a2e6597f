"""Chain scaling (``fedmcmc bench``): what 30 chains gain over 1, for every registered sampler.

Each sampler runs on its natural small problem, in this process (one XLA device, no worker
processes: the gain measured is that of running chains together under ``vmap``, the same on
any number of cores), with 1 and with 30 chains, the runs interleaved and the best of
``repeats`` kept. What is timed is the simulator's compiled chunk of rounds
(:class:`fedmcmc.runtime.simulator.Chains`), not a whole :func:`fedmcmc.simulate` call, whose
set-up would count against 1 chain. The gain is the ratio of chain-iterations per second, 30 chains over 1;
QLSD*'s gain is the reference every sampler is held to (:data:`TARGET` of it).

The problems (step sizes small enough that no chain diverges in a short run):

* the QLSD toy Gaussian (20 clients, d = 50, minibatches of N_i / 10; 4-bit quantisation for
  the compressing samplers): QLSD#, QLSD*, LSD*, QLSD++, LSD++, DG-SGLD, FedAvg; SGLD and pSGLD
  on its pooled data with the same total minibatch;
* the FA-HMC Section 5.2 factors (10 clients, d = 10; K = 5, 50 leapfrog steps a round):
  FA-HMC and FA-LD;
* the FSGLD Section 5.1 Gaussian blobs (10 shards, d = 2; 20 local steps a visit,
  minibatches of 10): DSGLD and CG-DSGLD.
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from fedmcmc.app import problems
from fedmcmc.compression import quantization
from fedmcmc.estimators import gradients
from fedmcmc.runtime.round import block_width
from fedmcmc.runtime.simulator import Chains
from fedmcmc.samplers import REGISTRY, cg_dsgld, dg_sgld, dsgld, fa_hmc, fa_ld, fedavg, lsd_pp, lsd_star, psgld, \
    qlsd_pp, qlsd_sharp, qlsd_star, sgld

CHAINS = 30
REFERENCE = "qlsd*"
TARGET = 0.8
"""Every sampler's gain should be at least this fraction of QLSD*'s."""


def cases() -> dict:
    """``name -> (sampler, data, dim, rounds per timed run)`` for every registered sampler."""
    toy = problems.heterogeneous_gaussian()
    data, model = toy.data, toy.model
    batch = np.maximum(np.asarray(data.counts) // 10, 1)
    mode = gradients.find_mode(model, data)
    q, step, w = quantization(16), 4.9e-4, np.asarray(data.weights)
    local = problems.heterogeneous_local_posteriors(dim=10)
    lw = np.asarray(local.data.weights)
    blobs = problems.gaussian_blobs()
    f = np.full(blobs.data.num_clients, 1.0 / blobs.data.num_clients)
    out = {
        "sgld": (sgld(model, step, int(batch.sum())), data.pooled(), 50, 2000),
        "psgld": (psgld(model, step, int(batch.sum())), data.pooled(), 50, 2000),
        "qlsd#": (qlsd_sharp(model, step, batch, q), data, 50, 2000),
        "qlsd*": (qlsd_star(model, step, mode, batch, q), data, 50, 2000),
        "lsd*": (lsd_star(model, step, mode, batch), data, 50, 2000),
        "qlsd++": (qlsd_pp(model, step, batch, q, refresh_every=100), data, 50, 2000),
        "lsd++": (lsd_pp(model, step, batch, refresh_every=100), data, 50, 2000),
        "dg-sgld": (dg_sgld(model, 0.5, 1e-4, batch_size=batch, num_clients=data.num_clients), data, 50, 2000),
        "fedavg": (fedavg(model, w, 1e-4, 2, batch, q), data, 50, 2000),
        "fa-hmc": (fa_hmc(local.model, lw, 0.05, 5, 50, correlation=1.0), local.data, 10, 100),
        "fa-ld": (fa_ld(local.model, lw, 0.005, 10), local.data, 10, 500),
        "dsgld": (dsgld(blobs.model, f, 1e-4, 20, batch_size=10), blobs.data, 2, 500),
        "cg-dsgld": (cg_dsgld(blobs.model, f, 1e-4, 20, batch_size=10), blobs.data, 2, 500),
    }
    missing = set(REGISTRY) - set(out)
    if missing:
        raise LookupError(f"no chain-scaling case for {sorted(missing)}: add one to cases()")
    return out


def _timer(sampler, data, dim: int, chains: int, rounds: int):
    """A function that runs ``rounds`` more rounds of ``chains`` chains (compiled here): the
    simulator's compiled chunk alone, in its blocks of chains, without a run's set-up, which
    would weigh on 1 chain."""
    block = Chains(sampler, data, None, 0, range(chains), np.zeros((chains, dim)), width=block_width(chains))
    run = partial(block.run, 0, rounds, 1)
    run()
    return run


def chain_scaling(rounds_scale: float = 1.0, repeats: int = 3, names=None) -> dict:
    """Chain-iterations per second with 1 and :data:`CHAINS` chains for every registered sampler.

    ``rounds_scale`` scales each case's rounds per timed run (``--quick``, tests); ``names``
    restricts the samplers (QLSD*, the reference, is always measured).
    """
    table = cases()
    names = list(table) if names is None else sorted(set(names) | {REFERENCE})
    runs = {}
    for name in names:
        sampler, data, dim, rounds = table[name]
        rounds = max(1, int(rounds * rounds_scale))
        runs[name] = {c: (_timer(sampler, data, dim, c, rounds), c * rounds) for c in (1, CHAINS)}
    best = {(name, c): float("inf") for name in runs for c in (1, CHAINS)}
    for _ in range(repeats):
        for name, by_chains in runs.items():
            for c, (run, _) in by_chains.items():
                t = time.perf_counter()
                run()
                best[name, c] = min(best[name, c], time.perf_counter() - t)
    rates = {name: {f"{c}_chains": runs[name][c][1] / best[name, c] for c in (1, CHAINS)} for name in runs}
    for rate in rates.values():
        rate["gain"] = rate[f"{CHAINS}_chains"] / rate["1_chains"]
    reference = rates[REFERENCE]["gain"]
    worst = min(rates, key=lambda n: rates[n]["gain"])
    return {"chain_iterations_per_second": rates, "reference": REFERENCE, "reference_gain": reference,
            "least_gain": {"sampler": worst, "gain": rates[worst]["gain"],
                           "relative_to_reference": rates[worst]["gain"] / reference},
            "target": f"every gain >= {TARGET} x {REFERENCE}'s",
            "settings": {"chains": CHAINS, "repeats": repeats, "rounds_scale": rounds_scale, "workers": 1}}
