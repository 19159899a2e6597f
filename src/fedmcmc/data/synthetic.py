"""Synthetic federated problems."""

from __future__ import annotations

import numpy as np

from fedmcmc.data.federated import FederatedData, from_clients


def heterogeneous_gaussian(seed: int = 1994, num_clients: int = 20, dim: int = 50,
                           min_size: int = 10, max_size: int = 200, mean_spread: float = 5.0,
                           noise_scale: float = 1.0) -> FederatedData:
    """The heterogeneous Gaussian toy problem of Vono et al. (AISTATS 2022, Section 4).

    Client ``i`` holds ``N_i ~ U{min_size, ..., max_size - 1}`` points
    ``x_ij ~ N(mu_i, noise_scale^2 I_d)`` around its own mean ``mu_i ~ N(0, mean_spread^2 I_d)``.
    The random numbers follow the authors' notebook (NumPy's legacy generator seeded with
    ``seed``: first the sizes, then for each client its mean and its points), which gives
    ``sum N_i = 2042`` for the default seed.
    """
    rng = np.random.RandomState(seed)
    sizes = rng.randint(low=min_size, high=max_size, size=num_clients)
    clients = []
    for n in sizes:
        mu = rng.normal(0.0, mean_spread, size=dim)
        clients.append(rng.normal(mu, noise_scale, size=(int(n), dim)))
    return from_clients(clients)
