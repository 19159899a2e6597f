"""Built-in problems with an exact posterior: the ``[problem]`` of a run config.

A problem is its clients' data, the model and the exact posterior (:class:`Problem`). The
registry :data:`PROBLEMS` maps a config name to its builder; a builder's keyword arguments
are the keys its ``[problem]`` section may set, and the first line of its docstring is what
``fedmcmc list`` prints.
"""

from __future__ import annotations

import inspect
from typing import Callable, NamedTuple

import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.data import synthetic
from fedmcmc.data.federated import FederatedData
from fedmcmc.models.gaussian import (GaussianPosterior, gaussian_factors, gaussian_factors_posterior, gaussian_mean,
                                     gaussian_mean_posterior)


class Problem(NamedTuple):
    data: FederatedData
    model: Model
    exact: GaussianPosterior


def heterogeneous_gaussian(seed: int = 1994, num_clients: int = 20, dim: int = 50, min_size: int = 10,
                           max_size: int = 200, mean_spread: float = 5.0) -> Problem:
    """Gaussian mean, heterogeneous clients, flat prior; exact posterior (QLSD Sec. 4).

    The data of :func:`fedmcmc.data.synthetic.heterogeneous_gaussian`, model
    :func:`~fedmcmc.models.gaussian_mean` with a flat prior.
    """
    data = synthetic.heterogeneous_gaussian(seed, num_clients, dim, min_size, max_size, mean_spread)
    return Problem(data, gaussian_mean(dim), gaussian_mean_posterior(data))


def heterogeneous_local_posteriors(num_clients: int = 10, dim: int = 50) -> Problem:
    """Half the clients N(20, I), half N(1, 4 I) locally; exact posterior (FA-HMC Sec. 5.2).

    The factors of :func:`fedmcmc.data.synthetic.heterogeneous_local_posteriors`, model
    :func:`~fedmcmc.models.gaussian_factors`.
    """
    data = synthetic.heterogeneous_local_posteriors(dim, num_clients)
    return Problem(data, gaussian_factors(dim), gaussian_factors_posterior(data))


def gaussian_blobs(data_seed: int = 666, num_shards: int = 10, points_per_shard: int = 200,
                   centre_range: float = 6.0, blob_scale: float = 1.0, prior_var: float = 5.0) -> Problem:
    """10 shards of 200 points around centres uniform in [-6, 6]^2, prior N(0, 5 I); exact posterior (FSGLD Sec. 5.1).

    The shards of :func:`fedmcmc.data.synthetic.gaussian_blobs`, model
    :func:`~fedmcmc.models.gaussian_mean` in 2-D with prior N(0, ``prior_var`` I).
    """
    data = synthetic.gaussian_blobs(data_seed, num_shards, points_per_shard, centre_range, blob_scale)
    prior_scale = float(np.sqrt(prior_var))
    return Problem(data, gaussian_mean(2, prior_scale=prior_scale), gaussian_mean_posterior(data, prior_scale=prior_scale))


PROBLEMS: dict[str, Callable[..., Problem]] = {
    "heterogeneous-gaussian": heterogeneous_gaussian,
    "heterogeneous-local-posteriors": heterogeneous_local_posteriors,
    "gaussian-blobs": gaussian_blobs,
}


def settings(name: str) -> dict:
    """The keys a ``[problem]`` section of this problem may set, with their defaults."""
    return {k: p.default for k, p in inspect.signature(PROBLEMS[name]).parameters.items()}


def summary(name: str) -> str:
    return inspect.getdoc(PROBLEMS[name]).splitlines()[0]
