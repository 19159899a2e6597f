"""Paper reproductions, each a small driver with a ``run(out, quick, seed)`` function."""

from __future__ import annotations

from types import ModuleType

from fedmcmc.experiments import (cgdsgld_gaussian_mean, cgdsgld_linear_regression, fahmc_dimension, fahmc_local_steps, fahmc_vs_fald,
                                 qlsd_logistic, qlsd_memory, qlsd_toy_gaussian)

EXPERIMENTS: dict[str, ModuleType] = {m.NAME: m for m in (qlsd_toy_gaussian, fahmc_vs_fald, fahmc_local_steps,
                                                          fahmc_dimension, cgdsgld_gaussian_mean,
                                                          cgdsgld_linear_regression, qlsd_memory, qlsd_logistic)}


def get(name: str) -> ModuleType:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; `fedmcmc list` shows the available ones: "
                         f"{', '.join(sorted(EXPERIMENTS))}")
    return EXPERIMENTS[name]
