"""FA-HMC against FA-LD at d = 10 (Liang et al. 2024, Section 5.1, Figure 1 d).

The study of :mod:`fedmcmc.app.studies.fahmc_vs_fald` (same generator, samplers, metric and
error bars; see its docstring) on the d = 10 data set with noisy gradients only, as in the
paper ("apart from the dimension d, the other settings are the same as those in the
experiments for Figure 1(b)"). At d = 10 a round is cheap, so the runs are much longer than at
d = 1000 and closer to the paper's regime where FA-LD has mixed (the paper: 2e7 steps).
``fedmcmc reproduce fahmc-vs-fald --set dim=10,...`` runs the same code; this name only
carries the d = 10 settings.
"""

from __future__ import annotations

from fedmcmc.app.studies import fahmc_vs_fald as base

NAME = "fahmc-vs-fald-d10"
SUMMARY = "FA-HMC vs FA-LD at d = 10: marginal error against step size, noisy gradients (FA-HMC Fig. 1 d)"

FULL = dict(base.FULL, dim=10, gradients=["noisy"], step_sizes=[0.005, 0.01, 0.02, 0.05, 0.1, 0.2],
            tuned_k=[10], rounds=2000, burn_in=1000, num_chains=24, chain_groups=6,
            reference_samples=5000, reference_chains=4, reference_warmup=1000)
QUICK = dict(FULL, step_sizes=[0.01, 0.05, 0.2], tuned_k=[3], rounds=600, burn_in=300, num_chains=16, chain_groups=4)

science = base.science  # the same study; only the settings differ
