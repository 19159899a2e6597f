"""A straightforward NumPy QLSD* that loops over clients every iteration.

This is the reference the benchmark measures our JAX runtime against: the same algorithm
(control variates at theta*, minibatches without replacement, stochastic quantisation with
``s`` levels, one Langevin step on the server) written the way the papers' own code is
written, one client and one chain at a time.
"""

from __future__ import annotations

import numpy as np


def quantize(rng: np.random.Generator, v: np.ndarray, s: int) -> np.ndarray:
    """Stochastic quantisation C^(s)(v) (Vono et al. 2022, eq. 4)."""
    norm = np.linalg.norm(v)
    if norm == 0:
        return np.zeros_like(v)
    r = s * np.abs(v) / norm
    low = np.floor(r)
    levels = low + (rng.random(v.shape) < r - low)
    return norm * np.sign(v) * levels / s


def gaussian_datum_grad(theta: np.ndarray, x: np.ndarray) -> np.ndarray:
    """grad_theta of -log N(x | theta, I) for each row of x."""
    return theta[None, :] - x


def qlsd_star(rng: np.random.Generator, clients: list[np.ndarray], theta_star: np.ndarray,
              client_grad_sum: np.ndarray, step_size: float, levels: int, batch_sizes: list[int],
              theta0: np.ndarray, num_iterations: int, datum_grad=gaussian_datum_grad) -> np.ndarray:
    """Run one chain of QLSD* and return its iterates ``[num_iterations, d]``."""
    theta = theta0.astype(np.float64).copy()
    out = np.empty((num_iterations, theta.size))
    for k in range(num_iterations):
        drift = client_grad_sum.copy()
        for x, n in zip(clients, batch_sizes):
            idx = rng.choice(len(x), size=n, replace=False)
            xb = x[idx]
            h = (len(x) / n) * (datum_grad(theta, xb) - datum_grad(theta_star, xb)).sum(axis=0)
            drift += quantize(rng, h, levels)
        theta = theta - step_size * drift + np.sqrt(2 * step_size) * rng.standard_normal(theta.size)
        out[k] = theta
    return out
