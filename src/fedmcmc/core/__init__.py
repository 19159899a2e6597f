"""The contract between algorithms and runtimes (:mod:`fedmcmc.core.base`), shared types, the
checks every builder uses (:mod:`fedmcmc.core.checks`), how programs are compiled
(:mod:`fedmcmc.core.xla`) and where what outlives a run is kept (:mod:`fedmcmc.core.cache`).
Every other layer builds on this one; it imports none of them."""

from fedmcmc.core.base import (ClientData, CompressionInfo, Compressor, FederatedSampler, Model, Participation,
                               Setup)

__all__ = ["FederatedSampler", "ClientData", "Model", "Compressor", "CompressionInfo", "Participation", "Setup"]
