"""Chain scaling (``fedmcmc bench``): what 30 chains gain over 1, for every registered sampler.

Each sampler runs in this process (one XLA device, no worker
processes: the gain measured is that of running chains together under ``vmap``, the same on
any number of cores), with 1 and with 30 chains, the runs interleaved and the best of
``repeats`` kept. What is timed is the simulator's compiled chunk of rounds
(:class:`fedmcmc.runtime.blocks.Chains`), not a whole :func:`fedmcmc.simulate` call, whose
set-up would count against 1 chain. The gain is the ratio of chain-iterations per second, 30 chains over 1;
QLSD*'s gain is the reference every sampler is held to (:data:`TARGET` of it).

Each sampler runs its registry entry's example run (:func:`fedmcmc.app.config.example`: the
settings of :attr:`fedmcmc.samplers.Registered.example` on the problem of
:attr:`~fedmcmc.samplers.Registered.problem`), :data:`ROUNDS` rounds a timed run: the QLSD toy
Gaussian (20 clients, d = 50) unless the entry names another problem (FA-HMC and FA-LD: the FA-HMC
Section 5.2 factors, d = 10; DSGLD and CG-DSGLD: the FSGLD Section 5.1 Gaussian blobs, d = 2).
"""

from __future__ import annotations

import time
from functools import partial

import numpy as np

from fedmcmc.app import config
from fedmcmc.runtime.round import block_width
from fedmcmc.runtime.blocks import Chains
from fedmcmc.samplers import REGISTRY

CHAINS = 30
REFERENCE = "qlsd*"
TARGET = 0.8
"""Every sampler's gain should be at least this fraction of QLSD*'s."""


#: Rounds of one timed run (scaled by ``rounds_scale``).
ROUNDS = 1000


def cases(names=None) -> dict:
    """``name -> (sampler, data, dim, rounds per timed run)``: the example run of every registered
    sampler (of ``names`` if given)."""
    out = {}
    for name in REGISTRY if names is None else names:
        built = config.build(config.example(name))
        out[name] = (built.sampler, built.data, built.model.dim, ROUNDS)
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
    names = list(REGISTRY) if names is None else sorted(set(names) | {REFERENCE})
    table = cases(names)
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
