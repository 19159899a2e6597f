"""fedmcmc: Bayesian federated learning by federated stochastic-gradient MCMC.

The names below are imported on first use: ``import fedmcmc`` (and so any of its modules)
imports no JAX by itself, which keeps a Flower ClientApp process that needs none light.
"""

import importlib

__version__ = "0.1.0"

_HOMES = {
    "fedmcmc.core.base": ("ClientData", "Compressor", "FederatedSampler", "Model", "Participation"),
    "fedmcmc.data.federated": ("FederatedData", "from_clients"),
    "fedmcmc.runtime": ("simulate", "SimulationResult", "DivergenceError", "tune_cpu"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = list(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'fedmcmc' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)
