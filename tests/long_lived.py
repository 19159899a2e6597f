"""One long-lived process that does what a user does: find the mode, run a NUTS reference,
then every registered sampler and every surrogate kind, on both runtime paths.

With ``fedmcmc.tune_cpu(2)`` a run of 1, 2 or 3 chains is one block and stays in this process,
and a run of 4 is two blocks of 2 in two worker processes (:func:`fedmcmc.runtime.round.block_width`).
Every sampler and surrogate kind runs with 4 chains (the worker path); the CG-DSGLD surrogate kinds, whose
LAPACK kernels held the old deadlock, also with 1 chain in this process, after find_mode and
NUTS have run here (every other sampler runs in the test processes themselves many times).

Run by ``test_no_hang.py``, which watches the lines printed here from outside and kills the
process if a step makes no progress. Prints ``START <step>`` before and ``DONE <step>``
after every step. The 4-chain run of every sampler also prints ``SAMPLES <name> <sha256>
<sum>``: the fingerprint of its draws, compared with ``golden/samples.json`` by the test.
"""

import hashlib
import time

import numpy as np

import fedmcmc
from catalog import breast_cancer, samplers
from fedmcmc.estimators import gradients
from fedmcmc.evaluation import reference


def step(label, fn):
    print(f"START {label}", flush=True)
    t = time.perf_counter()
    fn()
    print(f"DONE {label} {time.perf_counter() - t:.1f}s", flush=True)


def main():
    fedmcmc.tune_cpu(2)
    data, model = breast_cancer()
    found = {}
    step("find_mode", lambda: found.setdefault("mode", gradients.find_mode(model, data)))
    step("nuts", lambda: reference.nuts(0, model, data, num_samples=50, num_chains=2, num_warmup=50,
                                        use_cache=False))
    for name, (sampler, d) in samplers(data, model, found["mode"]).items():
        for chains in (1, 4) if name.startswith("cg-dsgld") else (4,):
            runs = {}
            step(f"{name} chains={chains}", lambda: runs.setdefault(chains, fedmcmc.simulate(
                0, sampler, d, np.zeros(model.dim, np.float32), 2, num_chains=chains)))
        draws = np.ascontiguousarray(runs[4].samples)
        print(f"SAMPLES {name} {hashlib.sha256(draws.tobytes()).hexdigest()} {float(draws.sum())!r}", flush=True)
    print("ALL DONE", flush=True)


if __name__ == "__main__":
    main()
