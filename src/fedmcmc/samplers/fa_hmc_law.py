"""The exact law of FA-HMC's chain on quadratic local potentials, and the trajectory it chooses.

On the Laplace approximation at the mode every client's local potential is quadratic,
``f^(c)(x) = (1/2) (x - m_c)' A_c (x - m_c) + const``, with ``A_c = H_0 + H_c / w_c`` (``H_0``
the prior's Hessian, ``H_c`` client ``c``'s likelihood Hessian, ``w_c`` its share) and
``m_c = -A_c^{-1} g_c`` (``g_c = grad f^(c)`` at the mode, the origin). Leapfrog with step ``eta``
is then linear: per eigenvalue ``lambda`` of ``A_c`` one step maps ``(x - m_c, p)`` by

    [[1 - eta^2 lambda / 2,                     eta                 ],
     [-eta lambda (1 - eta^2 lambda / 4),       1 - eta^2 lambda / 2]],

and a trajectory of ``K`` steps from a fresh momentum ``p`` gives ``x_K = P_c x + Q_c p +
(I - P_c) m_c`` (``P_c``, ``Q_c`` the blocks of the ``K``-th power, functions of ``A_c``). A round
of FA-HMC on the trajectory clock (:func:`fedmcmc.samplers.fa_hmc`) runs ``T`` trajectories on
every client from the server's ``x`` and averages, so with the momenta ``p^(c)_t = sqrt(rho) xi_t
+ sqrt(1 - rho) xi^(c)_t / sqrt(w_c)`` the round is the Gaussian recursion

    x' = M x + b + e,    M = sum_c w_c P_c^T,    b = sum_c w_c (I - P_c^T) m_c,
    Cov(e) = sum_t [rho N_t N_t' + (1 - rho) sum_c w_c R_ct R_ct'],
    R_ct = P_c^(T-1-t) Q_c,    N_t = sum_c w_c R_ct,

whose stationary law is ``N(mu, S)``, ``mu = (I - M)^{-1} b`` and ``S = M S M' + Cov(e)`` (a
discrete Lyapunov equation), whenever ``M``'s eigenvalues lie inside the unit circle. The
posterior's Laplace approximation is ``N(0, H^{-1})``, ``H = sum_c w_c A_c``. Exact, not bounded:
it accounts for the clients' different curvatures and pulls (the heterogeneity that
:mod:`fedmcmc.samplers.steps` bounds), the leapfrog discretisation and the shared momentum, for
full-batch, uncompressed rounds under full participation.

**The choice** (``num_leapfrog = "auto"`` with ``step_size = "auto"``): over a grid of steps ``eta``
(up to leapfrog's stability edge ``2 / sqrt(lambda_max(A_c))`` on every client) and trajectory
lengths ``K``, the pair whose round forgets its state fastest, that is the smallest integrated
autocorrelation time ``tau = (1 + r) / (1 - r)`` of the slowest mode (``r`` the largest ``|eigenvalue|``
of ``M``; ``M`` is symmetric, a sum of functions of the ``A_c``), among those whose stationary
law keeps every linear combination's sd within :data:`fedmcmc.samplers.steps.STD_INFLATION` of the
Laplace approximation's (the eigenvalues of ``H^(1/2) S H^(1/2)``) and the mean within
:data:`fedmcmc.samplers.steps.MEAN_OFFSET` of its sds (``||H^(1/2) mu||``); of the pairs within 5% of
the best ``tau``, the shortest trajectory. The clients' Hessians and gradients at the mode come from
the rounds the automatic step already asks (one of Hessians, one of gradients), so the choice costs
no round of its own; the law is only as good as the Laplace approximation, which the run's
posterior check tests.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: The grid: steps per client stability edge, and trajectory lengths.
STEP_FRACTIONS = np.geomspace(0.01, 0.95, 40)
MAX_LEAPFROG = 64
#: Of the admissible pairs within this factor of the best autocorrelation time, the shortest trajectory.
TIE = 1.05


class Law(NamedTuple):
    """The stationary law of a round's recursion ``x' = M x + b + e`` (module docstring).

    Attributes
    ----------
    mean, cov
        ``mu`` and ``S``; NaN where the recursion is unstable.
    radius
        The largest ``|eigenvalue|`` of ``M``.
    sd_ratios
        ``(lowest, highest)`` ratio of a linear combination's stationary sd to its sd under
        ``N(0, H^{-1})``.
    mean_offset
        ``||H^(1/2) mu||``: the largest offset of a linear combination's mean, in its sds.
    """

    mean: np.ndarray
    cov: np.ndarray
    radius: float
    sd_ratios: tuple
    mean_offset: float

    @property
    def autocorrelation_time(self) -> float:
        """``(1 + r) / (1 - r)`` in rounds, ``r`` = :attr:`radius` (inf when unstable)."""
        return (1 + self.radius) / (1 - self.radius) if self.radius < 1 else np.inf


def _powers(lam: np.ndarray, eta: float, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``(x, x)`` and ``(x, p)`` entries of ``K`` leapfrog steps per eigenvalue ``lam``."""
    a = 1 - eta**2 * lam / 2
    step = np.stack([np.stack([a, np.full_like(lam, eta)], -1),
                     np.stack([-eta * lam * (1 - eta**2 * lam / 4), a], -1)], -2)
    power = np.linalg.matrix_power(step, k)
    return power[..., 0, 0], power[..., 0, 1]


class _Clients(NamedTuple):
    """What every law of the same clients shares: the ``A_c``'s eigen-decompositions, the
    ``m_c``, the shares and ``H^(1/2)``."""

    lam: np.ndarray
    vec: np.ndarray
    centres: np.ndarray
    weights: np.ndarray
    root: np.ndarray


def _clients(hessians, gradients, weights) -> _Clients:
    a, g, w = (np.asarray(v, np.float64) for v in (hessians, gradients, weights))
    a = 0.5 * (a + np.swapaxes(a, -1, -2))
    lam, vec = np.linalg.eigh(a)
    hl, hv = np.linalg.eigh(np.einsum("c,cij->ij", w, a))
    return _Clients(lam, vec, -np.linalg.solve(a, g[..., None])[..., 0], w, (hv * np.sqrt(hl)) @ hv.T)


def round_law(hessians, gradients, weights, eta: float, num_leapfrog: int, trajectories: int = 1,
              correlation: float = 0.0) -> Law:
    """The stationary law of a round of FA-HMC on quadratic local potentials.

    Parameters
    ----------
    hessians, gradients
        ``[b, d, d]`` ``A_c`` and ``[b, d]`` ``g_c``: the clients' local potentials' Hessians and
        gradients at the mode (the origin).
    weights
        ``[b]`` shares ``w_c`` (summing to one).
    eta, num_leapfrog, trajectories, correlation
        The step, ``K``, the trajectories per round ``T`` and ``rho``.
    """
    return _law(_clients(hessians, gradients, weights), eta, num_leapfrog, trajectories, correlation)


def _law(s: _Clients, eta: float, num_leapfrog: int, trajectories: int, correlation: float) -> Law:
    d = s.lam.shape[-1]
    pxx, pxp = _powers(s.lam, float(eta), int(num_leapfrog))
    M, b, cov = np.zeros((d, d)), np.zeros(d), np.zeros((d, d))
    shared = [np.zeros((d, d)) for _ in range(trajectories)]
    for c, (v, w, m) in enumerate(zip(s.vec, s.weights, s.centres)):
        for t in range(trajectories):  # R_ct = P_c^(T-1-t) Q_c
            r = (v * (pxx[c] ** (trajectories - 1 - t) * pxp[c])) @ v.T
            shared[t] += w * r
            cov += (1 - correlation) * w * r @ r.T
        full = (v * pxx[c] ** trajectories) @ v.T
        M += w * full
        b += w * (m - full @ m)
    cov += correlation * sum(n @ n.T for n in shared)
    radius = float(np.max(np.abs(np.linalg.eigvalsh(0.5 * (M + M.T)))))
    if not radius < 1:
        return Law(np.full(d, np.nan), np.full((d, d), np.nan), radius, (np.nan, np.nan), np.nan)
    from scipy.linalg import solve_discrete_lyapunov

    mean = np.linalg.solve(np.eye(d) - M, b)
    stationary = solve_discrete_lyapunov(M, 0.5 * (cov + cov.T))
    ratios = np.sqrt(np.clip(np.linalg.eigvalsh(s.root @ stationary @ s.root), 0, None))
    return Law(mean, stationary, radius, (float(ratios[0]), float(ratios[-1])), float(np.linalg.norm(s.root @ mean)))


class Choice(NamedTuple):
    """The trajectory :func:`choose` picked and its law."""

    step_size: float
    num_leapfrog: int
    law: Law


def choose(hessians, gradients, weights, trajectories: int, correlation: float, std_inflation: float,
           mean_offset: float) -> Choice:
    """``(eta, K)`` of the fastest-forgetting round whose law keeps every linear combination's sd
    within a factor ``1 + std_inflation`` and its mean within ``mean_offset`` sds (module
    docstring; ``num_leapfrog = "auto"`` gives :data:`fedmcmc.samplers.steps.STD_INFLATION` and
    :data:`fedmcmc.samplers.steps.MEAN_OFFSET`). Raises ValueError when no pair on the grid does.
    """
    clients = _clients(hessians, gradients, weights)
    edge = 2.0 / np.sqrt(np.max(clients.lam))
    found = []
    for eta in edge * STEP_FRACTIONS:
        for k in range(1, MAX_LEAPFROG + 1):
            law = _law(clients, eta, k, trajectories, correlation)
            low, high = law.sd_ratios
            if (law.radius < 1 and high <= 1 + std_inflation and low >= 1 / (1 + std_inflation)
                    and law.mean_offset <= mean_offset):
                found.append((law.autocorrelation_time, k, -eta, law))
    if not found:
        raise ValueError(f"no FA-HMC trajectory (step up to {edge:.3g}, up to {MAX_LEAPFROG} leapfrog steps) keeps the "
                         f"law of a round of {trajectories} trajector{'y' if trajectories == 1 else 'ies'} on the "
                         f"clients' Laplace approximations within {std_inflation:.0%} of the posterior's sds and "
                         f"{mean_offset:g} sd of its mean: the clients are too heterogeneous for this many local "
                         "trajectories; use fewer (local_steps), correlation = 1, or vr-fald* / qlsd++")
    best = min(f[0] for f in found)
    _, k, eta, law = min((f for f in found if f[0] <= TIE * best), key=lambda f: (f[1], f[2]))
    return Choice(float(-eta), int(k), law)
