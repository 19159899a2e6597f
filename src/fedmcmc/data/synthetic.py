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


def heterogeneous_local_posteriors(dim: int, num_clients: int = 10, means=(20.0, 1.0),
                                   scales=(1.0, 2.0)) -> FederatedData:
    """The heterogeneous Gaussian of Liang et al. (2024, Section 5.2), for :func:`~fedmcmc.models.gaussian_factors`.

    The first half of the clients has local posterior N(means[0] 1_d, scales[0]^2 I), the
    second half N(means[1] 1_d, scales[1]^2 I); client weights are equal, ``w_c = 1 / b``.
    Client ``c`` holds the single factor ``(mu_c 1_d, w_c / s_c^2)``, so that its FA-HMC local
    potential ``U_c / w_c`` is ``||theta - mu_c||^2 / (2 s_c^2)``. With the defaults the global
    posterior is N(16.2 1_d, 1.6 I): the paper's "N(1_d, 2 I)" must mean a standard deviation
    of 2 (a variance of 2 would give N(13.67 1_d, 1.33 I)).
    """
    if num_clients < 2 or num_clients % 2:
        raise ValueError(f"num_clients must be an even number >= 2 (got {num_clients})")
    half = num_clients // 2
    clients = []
    for c in range(num_clients):
        g = 0 if c < half else 1
        m = np.full((1, dim), means[g])
        lam = np.full((1,), (1.0 / num_clients) / scales[g] ** 2)
        clients.append((m, lam))
    return from_clients(clients)


def gaussian_blobs(seed: int = 666, num_shards: int = 10, points_per_shard: int = 200, centre_range: float = 6.0,
                   scale: float = 1.0) -> FederatedData:
    """The Gaussian blobs of El Mekkaoui et al. (UAI 2021, Section 5.1), for a 2-D
    :func:`~fedmcmc.models.gaussian_mean` (:func:`fedmcmc.app.problems.gaussian_blobs`).

    Shard ``s`` holds ``points_per_shard`` points ``c_s + scale * N(0, I_2)`` around a centre
    ``c_s ~ U([-centre_range, centre_range]^2)``; NumPy's generator seeded with ``seed`` draws
    the centres first, then each shard's points (the seed of the authors' notebook).
    """
    rng = np.random.default_rng(seed)
    centres = rng.uniform(-centre_range, centre_range, (num_shards, 2))
    return from_clients([c + scale * rng.standard_normal((points_per_shard, 2)) for c in centres])


def logistic_regression_data(seed: int = 0, dim: int = 10, num_points: int = 1000, num_clients: int = 20,
                             feature_scale: float = 0.1):
    """Simulated logistic-regression data split equally over clients (Liang et al. 2024, Section 5.1).

    The paper gives the sizes (1,000 points, 20 nodes) but not the generator; ours:
    ``x ~ N(0, feature_scale^2 I_d)``, ``theta_true ~ N(0, I_d)``,
    ``y ~ Bernoulli(sigmoid(x . theta_true))``, shuffled and dealt in equal parts. With the
    default scale the posterior precision (with the N(0, I) prior) is about 3, the curvature
    for which the paper's trajectory length ``K eta = pi / 3`` is a sensible choice; larger
    scales make the local potentials more heterogeneous (docs/reproductions.md).
    Returns ``(FederatedData, theta_true)``.
    """
    if num_points % num_clients:
        raise ValueError(f"num_points ({num_points}) must be a multiple of num_clients ({num_clients})")
    rng = np.random.default_rng(seed)
    theta = rng.standard_normal(dim)
    x = feature_scale * rng.standard_normal((num_points, dim))
    y = (rng.random(num_points) < 1.0 / (1.0 + np.exp(-x @ theta))).astype(np.float32)
    parts = np.split(rng.permutation(num_points), num_clients)
    return from_clients([(x[p], y[p]) for p in parts]), theta
