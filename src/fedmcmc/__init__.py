"""fedmcmc: Bayesian federated learning by federated stochastic-gradient MCMC."""

from fedmcmc.core.base import ClientData, Compressor, FederatedSampler, Model, Participation
from fedmcmc.data.federated import FederatedData, from_clients
from fedmcmc.runtime import DivergenceError, SimulationResult, simulate, tune_cpu

__version__ = "0.1.0"

__all__ = [
    "ClientData", "Compressor", "FederatedSampler", "Model", "Participation",
    "FederatedData", "from_clients", "simulate", "SimulationResult", "DivergenceError", "tune_cpu",
]
