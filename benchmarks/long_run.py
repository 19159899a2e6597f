"""A whole QLSD* run as a user runs it (30 chains, 40,000 rounds): time the process from outside.

``python benchmarks/long_run.py [WORKERS]``; in a checkout without ``fedmcmc.tune_cpu`` the
chains go over that checkout's own default.
"""
import sys
import time

import numpy as np

import fedmcmc

getattr(fedmcmc, "tune_cpu", lambda *a: None)(*([] if len(sys.argv) < 2 else [int(sys.argv[1])]))
from fedmcmc.app.bench import _toy, STEP, LEVELS  # noqa: E402 - after tune_cpu, which must come first
from fedmcmc.samplers import qlsd_star  # noqa: E402
from fedmcmc.compression import quantization  # noqa: E402
data, model, batch, mode = _toy()
s = qlsd_star(model, STEP, mode, batch, quantization(LEVELS))
t = time.perf_counter()
r = fedmcmc.simulate(1, s, data, np.zeros(50), 40000, num_chains=30, thinning=10)
print("rate", 30 * 40000 / (time.perf_counter() - t), float(r.samples.sum()))
