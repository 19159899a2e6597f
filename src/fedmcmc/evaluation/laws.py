"""Exact laws of discretised federated chains on Gaussian targets.

On isotropic quadratic local potentials ``f^(c)(theta) = (lam_c / 2) ||theta - mu_c||^2`` with
exact or Gaussian-noised gradients, every operation of FA-HMC is affine in the clients'
positions, momenta and anchors, with Gaussian innovations (momentum draws, and one gradient
noise per half-kick), and coordinates are independent. The law of the averaged ``theta``
after each round is therefore Gaussian, and its mean and variance follow from a linear
recursion on one coordinate's state ``z = [x_1..x_N, p_1..p_N, h_1..h_N, s]`` (positions,
momenta, anchor gradients, start of round). The momenta are part of the state because on the
leapfrog clock a trajectory can run across synchronisations. These are the laws of the
*discretised* chains, bias included, against which the statistical tests and the dimension
study compare.

On the leapfrog clock with ``K`` not dividing the ``S`` leapfrog steps of a round, where the
trajectories start inside a round depends on the round number ``k`` through ``k S mod K``:
the round maps repeat with period ``P = K / gcd(K, S)``, and the chain has one stationary
law per phase ``r mod P`` of the number ``r`` of rounds done (``P = 1`` when ``K`` divides ``S``,
and always on the trajectory clock).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy import linalg

from fedmcmc.samplers.trajectories import round_period, steps_per_round


class AffineGaussian(NamedTuple):
    """``z -> A z + b + N(0, Q)``."""

    A: np.ndarray
    b: np.ndarray
    Q: np.ndarray

    @classmethod
    def identity(cls, dim: int) -> "AffineGaussian":
        return cls(np.eye(dim), np.zeros(dim), np.zeros((dim, dim)))

    def then(self, A, b=None, L=None) -> "AffineGaussian":
        """Compose with ``z -> A z + b + L eps`` applied after this map."""
        b = np.zeros(A.shape[0]) if b is None else b
        Q = A @ self.Q @ A.T
        if L is not None:
            Q = Q + L @ L.T
        return AffineGaussian(A @ self.A, A @ self.b + b, Q)

    def then_map(self, other: "AffineGaussian") -> "AffineGaussian":
        """Compose with the map ``other`` applied after this one."""
        return AffineGaussian(other.A @ self.A, other.A @ self.b + other.b, other.A @ self.Q @ other.A.T + other.Q)


class RoundLaw(NamedTuple):
    """Mean and variance of one coordinate of the averaged ``theta`` after rounds ``0, 1, ...``
    (or, for a stationary law, after ``r`` rounds with ``r mod P = 0, 1, ..., P - 1``)."""

    mean: np.ndarray
    var: np.ndarray


def fa_hmc_round_map(curvatures, centres, weights, step_size: float, num_leapfrog: int, local_steps: int,
                     correlation: float = 0.0, gradient_noise: float = 0.0, debiased: bool = False,
                     clock: str = "leapfrog", momentum_sync: str = "local", round_index: int = 0) -> AffineGaussian:
    """Round ``round_index`` of FA-HMC (:func:`fedmcmc.samplers.fa_hmc`) as an affine Gaussian map of ``z``.

    Mirrors the sampler operation by operation: the round starts with every client at the
    averaged ``theta`` (held in ``x`` as ``sum_c w_c x_c``; with ``momentum_sync="average"``,
    every momentum at the averaged momentum) and runs the round's ``S`` leapfrog steps
    ``n = k S + t``, drawing momenta where ``n`` is a multiple of ``K``; a step is a half-kick
    with its own gradient noise, a drift, and a half-kick with another (Algorithm 1). It ends
    with the weighted average; the de-biased variant uses the anchors of the previous round and
    stores new ones at the round's start.
    """
    lam = np.asarray(curvatures, float)
    mu = np.asarray(centres, float)
    w = np.asarray(weights, float)
    n = lam.size
    x, p, h, s = np.arange(n), n + np.arange(n), 2 * n + np.arange(n), 3 * n
    dim = 3 * n + 1
    eye = np.eye(dim)
    eta, sigma, rho = float(step_size), float(gradient_noise), float(correlation)
    K = int(num_leapfrog)
    steps = steps_per_round(K, int(local_steps), clock)
    average = np.outer(np.ones(n), w)

    # start: every client at theta = sum_c w_c x_c; remember it in s
    A = eye.copy()
    A[x] = 0.0
    A[np.ix_(x, x)] = average
    A[s] = 0.0
    A[s, x] = w
    if momentum_sync == "average":
        A[np.ix_(p, p)] = average
    law = AffineGaussian.identity(dim).then(A)

    def kick(scale):
        # p <- p - scale * (lam (x - mu) + [debiased] (sum_j w_j h_j - h) + sigma eps), a fresh eps
        A = eye.copy()
        b = np.zeros(dim)
        A[p, x] -= scale * lam
        b[p] = scale * lam * mu
        if debiased:
            A[np.ix_(p, h)] -= scale * average
            A[p, h] += scale
        L = np.zeros((dim, n))
        L[p, np.arange(n)] = -scale * sigma
        return A, b, L

    drift = eye.copy()
    drift[x, p] += eta
    leapfrog_step = AffineGaussian.identity(dim).then(*kick(0.5 * eta)).then(drift).then(*kick(0.5 * eta))
    draw = eye.copy()
    draw[p, p] = 0.0
    draw_noise = np.zeros((dim, n + 1))
    draw_noise[p, 0] = np.sqrt(rho)
    draw_noise[p, 1 + np.arange(n)] = np.sqrt(1.0 - rho) / np.sqrt(w)

    for t in range(steps):
        if (int(round_index) * steps + t) % K == 0:
            law = law.then(draw, L=draw_noise)
        law = law.then_map(leapfrog_step)
    # average (the next round's start sets every x to it); anchors at the round's start
    A = eye.copy()
    A[x] = 0.0
    A[np.ix_(x, x)] = average
    b = np.zeros(dim)
    A[h] = 0.0  # without de-biasing the anchors stay zero
    if debiased:
        A[h, s] = lam
        b[h] = -lam * mu
    return law.then(A, b)


def _cycle(maps) -> AffineGaussian:
    cycle = AffineGaussian.identity(maps[0].A.shape[0])
    for M in maps:
        cycle = cycle.then_map(M)
    return cycle


def _maps(curvatures, centres, weights, step_size, num_leapfrog, local_steps, correlation, gradient_noise,
          debiased, clock, momentum_sync) -> list[AffineGaussian]:
    period = round_period(num_leapfrog, local_steps, clock)
    return [fa_hmc_round_map(curvatures, centres, weights, step_size, num_leapfrog, local_steps, correlation,
                             gradient_noise, debiased, clock, momentum_sync, i) for i in range(period)]


def fa_hmc_radius(curvatures, weights, step_size: float, num_leapfrog: int, local_steps: int,
                  correlation: float = 0.0, debiased: bool = False, clock: str = "leapfrog",
                  momentum_sync: str = "local") -> float:
    """Spectral radius of FA-HMC's mean map over one period of rounds on quadratic local
    potentials (settings as :func:`fa_hmc_law`): the chain has a stationary law iff it is below 1.

    De-biased FA-HMC can exceed 1 at any step size once the local trajectories are long: over
    ``T`` leapfrog steps client ``c`` relaxes towards the minimiser of its *corrected* potential,
    ``theta_s - grad f(theta_s) / lam_c`` from the synchronisation point ``theta_s``, so the
    averaged move is ``-(sum_c w_c / lam_c) grad f(theta_s)``, a Newton step with the mean of
    the inverse curvatures instead of the inverse of the mean curvature
    ``lam = sum_c w_c lam_c``. It overshoots by the factor ``lam sum_c w_c / lam_c >= 1``, and past
    2 the mean map expands: a client whose potential is nearly flat where the others' is not
    (docs/design.md, "The posterior check") makes the round unstable.
    """
    maps = _maps(curvatures, np.zeros(np.size(curvatures)), weights, step_size, num_leapfrog, local_steps,
                 correlation, 0.0, debiased, clock, momentum_sync)
    return float(np.max(np.abs(linalg.eigvals(_cycle(maps).A))))


def fa_hmc_law(curvatures, centres, weights, step_size: float, num_leapfrog: int, local_steps: int,
               correlation: float = 0.0, gradient_noise: float = 0.0, debiased: bool = False,
               theta0: float = 0.0, rounds: int | None = None, clock: str = "leapfrog",
               momentum_sync: str = "local") -> RoundLaw:
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
        Return the law after rounds ``0..rounds``; if None, the stationary law: arrays of
        ``P`` entries (:func:`fedmcmc.samplers.trajectories.round_period`), entry ``i`` the
        law after ``r`` rounds with ``r = i (mod P)`` (one entry when ``K`` divides the steps
        per round).

    Other parameters as :func:`fedmcmc.samplers.fa_hmc`.
    """
    maps = _maps(curvatures, centres, weights, step_size, num_leapfrog, local_steps, correlation, gradient_noise,
                 debiased, clock, momentum_sync)
    period = len(maps)
    w = np.asarray(weights, float)
    n = w.size
    size = maps[0].A.shape[0]
    read = np.zeros(size)
    read[:n] = w
    if rounds is None:
        cycle = _cycle(maps)
        radius = np.max(np.abs(linalg.eigvals(cycle.A)))
        if radius >= 1:
            raise ValueError(f"the chain has no stationary law (spectral radius {radius:.4g} >= 1): lower the step "
                             "size, or with debiased = true the local steps (fa_hmc_radius)")
        C = linalg.solve_discrete_lyapunov(cycle.A, cycle.Q)
        m = np.linalg.solve(np.eye(size) - cycle.A, cycle.b)
        means, variances = [], []
        for M in maps:
            means.append(read @ m)
            variances.append(read @ C @ read)
            m, C = M.A @ m + M.b, M.A @ C @ M.A.T + M.Q
        return RoundLaw(np.asarray(means), np.asarray(variances))
    m = np.zeros(size)
    m[:n] = theta0
    C = np.zeros((size, size))
    means, variances = [read @ m], [read @ C @ read]
    for r in range(rounds):
        M = maps[r % period]
        m = M.A @ m + M.b
        C = M.A @ C @ M.A.T + M.Q
        means.append(read @ m)
        variances.append(read @ C @ read)
    return RoundLaw(np.asarray(means), np.asarray(variances))
