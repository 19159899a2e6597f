"""Distances between sample sets and target laws, and communication to reach a precision.

* ``marginal_error``: ME = (1/d) sum_i W1(mu_i, nu_i) over coordinate marginals (Liang et al.
  2024, Section 5.1), with W1 between empirical laws computed exactly.
* ``w2_gaussian``: W2 between Gaussians in closed form; ``w2_to_gaussian`` plugs in a sample's
  mean and covariance.
* ``rounds_to_reach``: R_eps, the first round at which an error curve reaches eps.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg


def wasserstein1(x, y) -> np.ndarray:
    """Exact W1 between the empirical laws of ``x[n, ...]`` and ``y[m, ...]``, per trailing index.

    ``W1 = int |F(t) - G(t)| dt`` over the merged sorted support, vectorised over coordinates.
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if x.shape[1:] != y.shape[1:]:
        raise ValueError(f"sample sets have different shapes per draw: {x.shape[1:]} and {y.shape[1:]}")
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError("W1 needs at least one draw in each sample set")
    x2 = x.reshape(x.shape[0], -1)
    y2 = y.reshape(y.shape[0], -1)
    xs, ys = np.sort(x2, axis=0), np.sort(y2, axis=0)
    both = np.sort(np.concatenate([xs, ys], axis=0), axis=0)
    gaps = np.diff(both, axis=0)
    points = both[:-1]
    out = np.empty(x2.shape[1])
    for j in range(x2.shape[1]):
        F = np.searchsorted(xs[:, j], points[:, j], side="right") / x2.shape[0]
        G = np.searchsorted(ys[:, j], points[:, j], side="right") / y2.shape[0]
        out[j] = np.sum(np.abs(F - G) * gaps[:, j])
    return out.reshape(x.shape[1:])


def marginal_error(samples, reference) -> float:
    """ME = (1/d) sum_i W1 between the i-th marginals of ``samples[n, d]`` and ``reference[m, d]``.

    Leading axes beyond the last are pooled (e.g. ``[chain, draw, d]``).
    """
    s = np.asarray(samples)
    r = np.asarray(reference)
    return float(np.mean(wasserstein1(s.reshape(-1, s.shape[-1]), r.reshape(-1, r.shape[-1]))))


def _sqrtm_psd(a):
    vals, vecs = linalg.eigh((a + a.T) / 2)
    return (vecs * np.sqrt(np.clip(vals, 0.0, None))) @ vecs.T


def w2_gaussian(mean1, cov1, mean2, cov2) -> float:
    """W2 between N(mean1, cov1) and N(mean2, cov2):

    W2^2 = ||m1 - m2||^2 + tr(S1 + S2 - 2 (S2^{1/2} S1 S2^{1/2})^{1/2}).

    Covariances may be matrices, vectors (diagonal) or scalars (isotropic).
    """
    m1, m2 = np.atleast_1d(np.asarray(mean1, np.float64)), np.atleast_1d(np.asarray(mean2, np.float64))
    d = max([m1.size, m2.size] + [np.shape(c)[0] for c in (cov1, cov2) if np.ndim(c) > 0])
    m1, m2 = np.broadcast_to(m1, (d,)), np.broadcast_to(m2, (d,))

    def as_matrix(c):
        c = np.asarray(c, np.float64)
        if c.ndim == 0:
            return c * np.eye(d)
        if c.ndim == 1:
            return np.diag(np.broadcast_to(c, (d,)))
        return c

    s1, s2 = as_matrix(cov1), as_matrix(cov2)
    r2 = _sqrtm_psd(s2)
    cross = _sqrtm_psd(r2 @ s1 @ r2)
    w2sq = float(np.sum((m1 - m2) ** 2) + np.trace(s1) + np.trace(s2) - 2.0 * np.trace(cross))
    return float(np.sqrt(max(w2sq, 0.0)))


def w2_to_gaussian(samples, mean, cov) -> float:
    """W2 between the Gaussian with the sample mean and covariance of ``samples[..., d]`` and N(mean, cov)."""
    s = np.asarray(samples, np.float64)
    s = s.reshape(-1, s.shape[-1])
    if s.shape[0] < 2:
        raise ValueError("W2 from samples needs at least two draws")
    return w2_gaussian(s.mean(axis=0), np.atleast_2d(np.cov(s, rowvar=False)), mean, cov)


def rounds_to_reach(errors, eps: float, rounds=None) -> float:
    """R_eps: the first round at which ``errors`` (one value per round) is at most ``eps``.

    ``rounds`` gives the round number of each entry (1, 2, ... if None). Returns ``inf`` when
    the curve never reaches ``eps``.
    """
    e = np.asarray(errors, np.float64)
    r = np.arange(1, e.size + 1) if rounds is None else np.asarray(rounds)
    hit = np.flatnonzero(e <= eps)
    return float(r[hit[0]]) if hit.size else float("inf")
