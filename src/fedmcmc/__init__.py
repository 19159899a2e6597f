"""fedmcmc: Bayesian federated learning by federated stochastic-gradient MCMC.

The names below are imported on first use: ``import fedmcmc`` (and so any of its modules)
imports no JAX by itself, which keeps a Flower ClientApp process that needs none light.
"""

from fedmcmc._lazy import exports as _exports

__version__ = "0.1.0"

_HOMES = {
    "fedmcmc.core.base": ("ClientData", "Compressor", "FederatedSampler", "Model", "Participation"),
    "fedmcmc.data.federated": ("FederatedData", "from_clients"),
    "fedmcmc.runtime": ("simulate", "SimulationResult", "DivergenceError", "tune_cpu"),
}
_HOME = {name: (module, name) for module, names in _HOMES.items() for name in names}

__all__ = list(_HOME)
__getattr__, __dir__ = _exports(__name__, globals(), _HOME)
