"""Running a sampler: one round (:mod:`fedmcmc.runtime.round`, with the key schedule) and the run
records (:mod:`fedmcmc.runtime.records`) shared by two drivers, the vectorised simulator
(:func:`simulate`, chains over worker processes after :func:`tune_cpu`) and the message runtime
that Flower carries (:mod:`fedmcmc.runtime.messaging`); outputs in ArviZ's schema
(:mod:`fedmcmc.runtime.io`).

The names below are imported on first use, as in :mod:`fedmcmc`: a module of this package that
needs no JAX (:mod:`fedmcmc.runtime.settings`) imports none.
"""

from fedmcmc._lazy import exports as _exports

_HOME = {"simulate": ("fedmcmc.runtime.simulator", "simulate"), "tune_cpu": ("fedmcmc.runtime.cpu", "tune"),
         **{name: ("fedmcmc.runtime.records", name) for name in ("SimulationResult", "DivergenceError")},
         **{name: ("fedmcmc.runtime.io", name) for name in ("to_inference_data", "write_posterior", "HeldOut",
                                                             "stored_draws")}}
__all__ = list(_HOME)
__getattr__, __dir__ = _exports(__name__, globals(), _HOME)
