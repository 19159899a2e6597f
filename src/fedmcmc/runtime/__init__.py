"""Running a sampler: one round (:mod:`fedmcmc.runtime.round`, with the key schedule) and the run
records (:mod:`fedmcmc.runtime.records`) shared by two drivers, the vectorised simulator
(:func:`simulate`, chains over worker processes after :func:`tune_cpu`) and the message runtime
that Flower carries (:mod:`fedmcmc.runtime.flower`); outputs in ArviZ's schema
(:mod:`fedmcmc.runtime.io`)."""

from fedmcmc.runtime.cpu import tune as tune_cpu
from fedmcmc.runtime.io import HeldOut, stored_draws, to_inference_data, write_posterior
from fedmcmc.runtime.records import DivergenceError, SimulationResult
from fedmcmc.runtime.simulator import simulate

__all__ = ["simulate", "SimulationResult", "DivergenceError", "tune_cpu", "to_inference_data", "write_posterior",
           "HeldOut", "stored_draws"]
