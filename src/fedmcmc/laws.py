"""Exact laws of discretised federated chains on Gaussian targets.

On isotropic quadratic local potentials ``f^(c)(theta) = (lam_c / 2) ||theta - mu_c||^2`` with
exact or Gaussian-noised gradients, every operation of FA-HMC is affine in the clients'
positions, momenta, gradient noises and anchors, with Gaussian innovations, and coordinates
are independent. The law of the averaged ``theta`` after each round is therefore Gaussian,
and its mean and variance follow from a linear recursion on one coordinate's state
``z = [x_1..x_N, p_1..p_N, e_1..e_N, h_1..h_N, s]`` (positions, momenta, current gradient
noises, anchor gradients, start of round). These are the laws of the *discretised* chains,
bias included, against which the statistical tests and the dimension study compare.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import linalg


class AffineGaussian(NamedTuple):
    """``z -> A z + b + N(0, Q)``."""

    A: np.ndarray
    b: np.ndarray
    Q: np.ndarray

    def then(self, A, b=None, L=None) -> "AffineGaussian":
        """Compose with ``z -> A z + b + L eps`` applied after this map."""
        b = np.zeros(A.shape[0]) if b is None else b
        Q = A @ self.Q @ A.T
        if L is not None:
            Q = Q + L @ L.T
        return AffineGaussian(A @ self.A, A @ self.b + b, Q)


class RoundLaw(NamedTuple):
    """Mean and variance of one coordinate of the averaged ``theta`` after rounds ``0, 1, ...``."""

    mean: np.ndarray
    var: np.ndarray


def fa_hmc_round_map(curvatures, centres, weights, step_size: float, num_leapfrog: int, local_steps: int,
                     correlation: float = 0.0, gradient_noise: float = 0.0,
                     debiased: bool = False) -> AffineGaussian:
    """One FA-HMC round (:func:`fedmcmc.samplers.fa_hmc`) as an affine Gaussian map of ``z``.

    Mirrors the sampler operation by operation: the round starts with every client at the
    averaged ``theta`` (held in ``x`` as ``sum_c w_c x_c``), draws a gradient, runs ``T``
    iterations of a momentum draw and ``K`` leapfrog steps, and ends with the weighted average;
    the de-biased variant uses the anchors of the previous round and stores new ones at the
    round's start.
    """
    lam = np.asarray(curvatures, float)
    mu = np.asarray(centres, float)
    w = np.asarray(weights, float)
    n = lam.size
    x, p, e, h, s = (np.arange(n), n + np.arange(n), 2 * n + np.arange(n), 3 * n + np.arange(n), 4 * n)
    dim = 4 * n + 1
    eye = np.eye(dim)
    eta, sigma, rho = float(step_size), float(gradient_noise), float(correlation)
    law = AffineGaussian(eye, np.zeros(dim), np.zeros((dim, dim)))

    # start: every client at theta = sum_c w_c x_c; remember it in s
    A = eye.copy()
    A[x] = 0.0
    A[np.ix_(x, x)] = np.outer(np.ones(n), w)
    A[s] = 0.0
    A[s, x] = w
    law = law.then(A)

    def refresh_noise(law):
        A = eye.copy()
        A[e, e] = 0.0
        L = np.zeros((dim, n))
        L[e, np.arange(n)] = sigma
        return law.then(A, L=L)

    def kick(law, scale):
        # p <- p - scale * (lam (x - mu) + e + [debiased] (sum_j w_j h_j - h))
        A = eye.copy()
        b = np.zeros(dim)
        A[p, x] -= scale * lam
        b[p] = scale * lam * mu
        A[p, e] -= scale
        if debiased:
            A[np.ix_(p, h)] -= scale * np.outer(np.ones(n), w)
            A[p, h] += scale
        return law.then(A, b)

    law = refresh_noise(law)
    for _ in range(local_steps):
        A = eye.copy()
        A[p, p] = 0.0
        L = np.zeros((dim, n + 1))
        L[p, 0] = np.sqrt(rho)
        L[p, 1 + np.arange(n)] = np.sqrt(1.0 - rho) / np.sqrt(w)
        law = law.then(A, L=L)
        for _ in range(num_leapfrog):
            law = kick(law, 0.5 * eta)
            A = eye.copy()
            A[x, p] += eta
            law = law.then(A)
            law = refresh_noise(law)
            law = kick(law, 0.5 * eta)
    # average (the next round's start sets every x to it); anchors at the round's start
    A = eye.copy()
    A[x] = 0.0
    A[np.ix_(x, x)] = np.outer(np.ones(n), w)
    b = np.zeros(dim)
    A[h] = 0.0  # without de-biasing the anchors stay zero
    if debiased:
        A[h, s] = lam
        b[h] = -lam * mu
    return law.then(A, b)


def fa_hmc_law(curvatures, centres, weights, step_size: float, num_leapfrog: int, local_steps: int,
               correlation: float = 0.0, gradient_noise: float = 0.0, debiased: bool = False,
               theta0: float = 0.0, rounds: int | None = None) -> RoundLaw:
    """Law of one coordinate of FA-HMC's averaged ``theta`` on quadratic local potentials.

    Parameters
    ----------
    curvatures, centres
        ``lam_c`` and ``mu_c`` (this coordinate) of each client's ``f^(c)``.
    weights
        ``w_c``.
    theta0
        The deterministic start.
    rounds
        Return the law after rounds ``0..rounds``; if None, the stationary law (arrays of one entry).

    Other parameters as :func:`fedmcmc.samplers.fa_hmc`.
    """
    M = fa_hmc_round_map(curvatures, centres, weights, step_size, num_leapfrog, local_steps, correlation,
                         gradient_noise, debiased)
    w = np.asarray(weights, float)
    n = w.size
    read = np.zeros(M.A.shape[0])
    read[:n] = w
    if rounds is None:
        radius = np.max(np.abs(linalg.eigvals(M.A)))
        if radius >= 1:
            raise ValueError(f"the chain has no stationary law (spectral radius {radius:.4g} >= 1): "
                             "lower the step size")
        C = linalg.solve_discrete_lyapunov(M.A, M.Q)
        m = np.linalg.solve(np.eye(M.A.shape[0]) - M.A, M.b)
        return RoundLaw(np.array([read @ m]), np.array([read @ C @ read]))
    m = np.zeros(M.A.shape[0])
    m[:n] = theta0
    C = np.zeros_like(M.A)
    means, variances = [read @ m], [read @ C @ read]
    for _ in range(rounds):
        m = M.A @ m + M.b
        C = M.A @ C @ M.A.T + M.Q
        means.append(read @ m)
        variances.append(read @ C @ read)
    return RoundLaw(np.asarray(means), np.asarray(variances))
