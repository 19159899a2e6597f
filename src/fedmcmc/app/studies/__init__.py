"""Paper reproductions: each module a study (``NAME``, ``SUMMARY``, ``FULL``, ``QUICK``, ``science``) that
:func:`fedmcmc.app.studies.runner.run_study` runs."""

from __future__ import annotations

from fedmcmc.app.studies import (cgdsgld_gaussian_mean, cgdsgld_linear_regression, cgdsgld_mlp, fahmc_dimension,
                                 fahmc_local_steps, fahmc_logistic, fahmc_mlp, fahmc_vs_fald, fahmc_vs_fald_d10,
                                 qlsd_big_data, qlsd_bnn_heterogeneous, qlsd_logistic, qlsd_memory, qlsd_omega,
                                 qlsd_toy_gaussian)
from fedmcmc.app.studies.runner import Study

EXPERIMENTS: dict[str, Study] = {m.NAME: m for m in (qlsd_toy_gaussian, qlsd_omega, qlsd_big_data, qlsd_memory,
                                                     qlsd_logistic, qlsd_bnn_heterogeneous, fahmc_vs_fald,
                                                     fahmc_vs_fald_d10, fahmc_local_steps, fahmc_dimension,
                                                     fahmc_logistic, fahmc_mlp, cgdsgld_gaussian_mean,
                                                     cgdsgld_linear_regression, cgdsgld_mlp)}


def get(name: str) -> Study:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; `fedmcmc list` shows the available ones: "
                         f"{', '.join(sorted(EXPERIMENTS))}")
    return EXPERIMENTS[name]
