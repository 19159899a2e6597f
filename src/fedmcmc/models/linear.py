"""Bayesian linear regression with known noise: y = x . theta + e, e ~ N(0, noise_scale^2),
prior theta ~ N(0, prior_scale^2 I). Conjugate, so the posterior is Gaussian and exact:

    Sigma^{-1} = I / prior_scale^2 + X'X / noise_scale^2,     mu = Sigma X'y / noise_scale^2.

With the noise unknown (:func:`linear_regression_unknown_noise`) ``log sigma`` is one more
parameter, with a Gaussian prior; its posterior has no closed form.

An intercept is a column of ones in ``x`` (see :func:`fedmcmc.data.with_intercept`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.data.federated import FederatedData


def linear_regression(dim: int, noise_scale: float = 1.0, prior_scale: float = 1.0) -> Model:
    """Build the model; a datum is ``(x, y)`` with ``x`` of shape ``[dim]`` and ``y`` a float."""
    if not noise_scale > 0 or not prior_scale > 0:
        raise ValueError(f"noise_scale and prior_scale must be > 0 (got {noise_scale}, {prior_scale})")
    s2, t2 = float(noise_scale) ** 2, float(prior_scale) ** 2
    const = -0.5 * np.log(2 * np.pi * s2)

    def log_likelihood(theta, datum):
        x, y = datum
        return const - 0.5 * (y - jnp.dot(x, theta)) ** 2 / s2

    def log_prior(theta):
        return -0.5 * jnp.sum(theta**2) / t2

    def predict(theta, inputs):
        """Predictive means ``[n]``: ``x . theta``."""
        return inputs @ theta

    return Model(log_likelihood, log_prior, dim, name="linear-regression", predict=predict)


#: The name of :func:`linear_regression_unknown_noise`'s models (outputs name its last coordinate ``log_sigma``).
UNKNOWN_NOISE_NAME = "linear-regression-unknown-noise"


def linear_regression_unknown_noise(dim: int, prior_scale: float = 1.0, noise_prior_scale: float = 1.0) -> Model:
    """Bayesian linear regression whose Gaussian noise scale is a parameter too.

    ``theta = [b, log sigma]`` of dimension ``dim + 1``; a datum is ``(x, y)`` with ``x`` of shape
    ``[dim]``. The likelihood and the prior (up to a constant) are

        log p(y | x, theta) = -log(2 pi) / 2 - log sigma - (y - x . b)^2 / (2 sigma^2),
        b ~ N(0, prior_scale^2 I),    log sigma ~ N(0, noise_prior_scale^2),

    so with ``noise_prior_scale = 1`` sigma lies within a factor ``e^2`` of 1 with probability
    0.95: weakly informative for a standardised target, in the target's own units otherwise.
    ``predict`` gives the means ``x . b``.
    """
    if not prior_scale > 0 or not noise_prior_scale > 0:
        raise ValueError(f"prior_scale and noise_prior_scale must be > 0 (got {prior_scale}, {noise_prior_scale})")
    t2, u2 = float(prior_scale) ** 2, float(noise_prior_scale) ** 2
    const = -0.5 * np.log(2 * np.pi)

    def log_likelihood(theta, datum):
        x, y = datum
        log_sigma = theta[-1]
        return const - log_sigma - 0.5 * ((y - jnp.dot(x, theta[:-1])) * jnp.exp(-log_sigma)) ** 2

    def log_prior(theta):
        return -0.5 * jnp.sum(theta[:-1] ** 2) / t2 - 0.5 * theta[-1] ** 2 / u2

    def predict(theta, inputs):
        """Predictive means ``[n]``: ``x . b``."""
        return inputs @ theta[:-1]

    return Model(log_likelihood, log_prior, dim + 1, name=UNKNOWN_NOISE_NAME, predict=predict)


class LinearPosterior(NamedTuple):
    """The exact posterior N(mean, cov) of :func:`linear_regression` (float64)."""

    mean: np.ndarray
    cov: np.ndarray


def linear_regression_posterior(data: FederatedData, noise_scale: float = 1.0,
                                prior_scale: float = 1.0) -> LinearPosterior:
    """Exact posterior of :func:`linear_regression` given all clients' data."""
    xs, ys = zip(*(data.unpadded(i) for i in range(data.num_clients)))
    x = np.concatenate(xs).astype(np.float64)
    y = np.concatenate(ys).astype(np.float64)
    precision = np.eye(x.shape[1]) / prior_scale**2 + x.T @ x / noise_scale**2
    cov = np.linalg.inv(precision)
    return LinearPosterior(cov @ (x.T @ y) / noise_scale**2, cov)


def unknown_noise_posterior(data: FederatedData, prior_scale: float = 1.0, noise_prior_scale: float = 1.0,
                            intercept: bool = False, grid: int = 4001) -> LinearPosterior:
    """The exact posterior mean and covariance of linear regression with unknown noise,
    ``theta = [beta, log sigma]``, ``beta ~ N(0, prior_scale^2 I)``, ``log sigma ~ N(0,
    noise_prior_scale^2)``, ``y ~ N(x . beta, sigma^2)``, by quadrature over ``log sigma``.

    Given ``sigma``, ``beta`` is Gaussian, ``N(mu_s, Sigma_s)`` with ``Sigma_s^{-1} = I / tau^2 +
    X'X / sigma^2`` and ``mu_s = Sigma_s X'y / sigma^2``, and ``beta`` integrates out of the
    likelihood, ``y ~ N(0, sigma^2 I + tau^2 X X')``; in the eigenbasis ``X'X = V diag(l) V'``,
    ``c = V'X'y``,

        log p(log sigma | y) = log N(log sigma; 0, s^2) - (n - p) log sigma - (1/2) sum_k log(sigma^2 + tau^2 l_k)
                               - (y'y - sum_k c_k^2 / (sigma^2 / tau^2 + l_k)) / (2 sigma^2) + const.

    The moments of ``theta`` are sums over a fine grid of ``log sigma`` (``grid`` points over 12
    standard deviations of its posterior around the peak) of the conditional moments: exact to
    the quadrature's error, far below any Monte-Carlo error. ``intercept`` prepends a column of
    ones to ``x`` (:func:`fedmcmc.models.with_intercept`). Returns the moments as a
    :class:`LinearPosterior` (the law itself is a scale mixture of Gaussians, not Gaussian).
    """
    xs, ys = zip(*(data.unpadded(i) for i in range(data.num_clients)))
    x = np.concatenate(xs).astype(np.float64)
    y = np.concatenate(ys).astype(np.float64)
    if intercept:
        x = np.concatenate([np.ones((len(x), 1)), x], axis=1)
    n, p = x.shape
    t2 = float(prior_scale) ** 2
    lam, v = np.linalg.eigh(x.T @ x)
    c, yy = v.T @ (x.T @ y), y @ y

    def log_density(u):  # u = log sigma, a vector
        s2 = np.exp(2 * u)[:, None]
        quad = yy - np.sum(c**2 / (s2 / t2 + lam), axis=1)
        return (-0.5 * (u / noise_prior_scale) ** 2 - (n - p) * u - 0.5 * np.sum(np.log(s2 + t2 * lam), axis=1)
                - 0.5 * quad / s2[:, 0])

    coarse = np.linspace(-30.0, 30.0, 6001)
    dens = log_density(coarse)
    peak = coarse[np.argmax(dens)]
    curvature = -(dens[np.argmax(dens) + 1] - 2 * dens.max() + dens[np.argmax(dens) - 1]) / (coarse[1] - coarse[0]) ** 2
    width = 6.0 / np.sqrt(max(curvature, 1e-12))
    u = np.linspace(peak - width, peak + width, grid)
    w = np.exp(log_density(u) - log_density(u).max())
    w /= w.sum()
    s2 = np.exp(2 * u)[:, None]
    cond_var = 1.0 / (1.0 / t2 + lam / s2)  # [grid, p], in the eigenbasis
    cond_mean = (cond_var * c / s2) @ v.T  # [grid, p]
    joint = np.concatenate([cond_mean, u[:, None]], axis=1)
    mean = w @ joint
    second = np.einsum("g,gi,gj->ij", w, joint, joint)
    second[:p, :p] += v @ np.diag(w @ cond_var) @ v.T
    return LinearPosterior(mean, second - np.outer(mean, mean))
