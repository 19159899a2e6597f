"""Gaussian mean model with a closed-form posterior.

Data x_ij ~ N(theta, sigma^2 I_d) and prior theta ~ N(m_0, tau^2 I_d) (or flat when
``prior_scale`` is None). The posterior is N(mu, v I_d) with

    1 / v = 1 / tau^2 + N / sigma^2,      mu = v (m_0 / tau^2 + sum_ij x_ij / sigma^2).

With a flat prior this is the toy problem of Vono et al. (AISTATS 2022, Section 4).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.data.federated import FederatedData


def gaussian_mean(dim: int, noise_scale: float = 1.0, prior_scale: float | None = None,
                  prior_mean: float = 0.0) -> Model:
    """Build the model x ~ N(theta, noise_scale^2 I), theta ~ N(prior_mean, prior_scale^2 I)."""
    if noise_scale <= 0:
        raise ValueError(f"noise_scale must be > 0 (got {noise_scale})")
    if prior_scale is not None and prior_scale <= 0:
        raise ValueError(f"prior_scale must be > 0 or None for a flat prior (got {prior_scale})")
    s2 = float(noise_scale) ** 2
    const = -0.5 * dim * np.log(2 * np.pi * s2)

    def log_likelihood(theta, x):
        return const - 0.5 * jnp.sum((x - theta) ** 2) / s2

    if prior_scale is None:
        def log_prior(theta):
            return jnp.zeros((), theta.dtype)
    else:
        t2 = float(prior_scale) ** 2

        def log_prior(theta):
            return -0.5 * jnp.sum((theta - prior_mean) ** 2) / t2

    return Model(log_likelihood, log_prior, dim, name="gaussian-mean")


class GaussianPosterior(NamedTuple):
    """The isotropic Gaussian N(mean, var I)."""

    mean: np.ndarray
    var: float

    def expected_norm(self) -> float:
        """E ||theta|| for theta ~ N(mean, var I_d): the mean of a noncentral chi law.

        E = sigma sqrt(2) Gamma((d+1)/2) / Gamma(d/2) 1F1(-1/2; d/2; -lambda^2/2),
        with sigma = sqrt(var) and lambda = ||mean|| / sigma.
        """
        from scipy import special  # here only: scipy costs a Flower client process 0.5 s to import

        d = self.mean.shape[0]
        sigma = np.sqrt(self.var)
        lam2 = float(np.sum(self.mean.astype(np.float64) ** 2)) / self.var
        log_ratio = special.gammaln((d + 1) / 2) - special.gammaln(d / 2)
        return float(sigma * np.sqrt(2) * np.exp(log_ratio) * special.hyp1f1(-0.5, d / 2, -lam2 / 2))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.mean + np.sqrt(self.var) * rng.standard_normal((n, self.mean.shape[0]))


def gaussian_mean_posterior(data: FederatedData, noise_scale: float = 1.0,
                            prior_scale: float | None = None, prior_mean: float = 0.0) -> GaussianPosterior:
    """Exact posterior of :func:`gaussian_mean` given all clients' data (float64)."""
    total = 0.0
    n = 0
    for i in range(data.num_clients):
        xi = np.asarray(data.unpadded(i), dtype=np.float64)
        total = total + xi.sum(axis=0)
        n += xi.shape[0]
    precision = n / noise_scale**2 + (0.0 if prior_scale is None else 1.0 / prior_scale**2)
    var = 1.0 / precision
    shift = 0.0 if prior_scale is None else prior_mean / prior_scale**2
    mean = var * (total / noise_scale**2 + shift)
    return GaussianPosterior(mean=np.asarray(mean), var=float(var))


def gaussian_factors(dim: int) -> Model:
    """Each datum is a Gaussian factor ``(m, lam)``: log p = -(lam / 2) ||theta - m||^2; flat prior.

    A client holding the factors ``(m_j, lam_j)`` has an isotropic Gaussian local potential;
    with one factor per client this states "client c's local posterior is N(mu_c, s_c^2 I)"
    directly (the heterogeneous Gaussian of Liang et al. 2024, Section 5.2), see
    :func:`fedmcmc.data.synthetic.heterogeneous_local_posteriors`.
    """

    def log_likelihood(theta, datum):
        m, lam = datum
        return -0.5 * lam * jnp.sum((theta - m) ** 2)

    def log_prior(theta):
        return jnp.zeros((), theta.dtype)

    return Model(log_likelihood, log_prior, dim, name="gaussian-factors")


def gaussian_factors_posterior(data: FederatedData) -> GaussianPosterior:
    """Exact posterior of :func:`gaussian_factors`: precision ``sum lam_j``, mean ``sum lam_j m_j / sum lam_j``."""
    means, lams = [], []
    for i in range(data.num_clients):
        m, lam = data.unpadded(i)
        means.append(np.asarray(m, np.float64))
        lams.append(np.asarray(lam, np.float64))
    m, lam = np.concatenate(means), np.concatenate(lams)
    precision = float(lam.sum())
    return GaussianPosterior(mean=(lam[:, None] * m).sum(axis=0) / precision, var=1.0 / precision)
