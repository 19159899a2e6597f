"""Distances between sample sets and target laws, and communication to reach a precision.

* ``marginal_error``: ME = (1/d) sum_i W1(mu_i, nu_i) over coordinate marginals (Liang et al.
  2024, Section 5.1), with W1 between empirical laws computed exactly.
* ``w2_gaussian``: W2 between Gaussians in closed form; ``w2_to_gaussian`` plugs in a sample's
  mean and covariance.
* ``rounds_to_reach``: R_eps, the first round at which an error curve reaches eps.
* ``relative_efficiency``: the fraction of bits saved against an uncompressed run.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg


def wasserstein1(x, y, y_sorted: bool = False) -> np.ndarray:
    """Exact W1 between the empirical laws of ``x[n, ...]`` and ``y[m, ...]``, per trailing index.

    ``W1 = int_0^1 |F^-1(u) - G^-1(u)| du``: both quantile functions are steps on the grid
    ``{i / n} U {j / m}``, the same for every coordinate, so after one sort per set the
    integral is a weighted sum of gathered order statistics, vectorised over coordinates
    (``O((n + m) d)`` after the sorts; for ``n = m`` it is ``mean |x_(i) - y_(i)|``).
    ``y_sorted=True`` says ``y`` is already sorted along its first axis (a reference used many
    times is sorted once).
    """
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if x.shape[1:] != y.shape[1:]:
        raise ValueError(f"sample sets have different shapes per draw: {x.shape[1:]} and {y.shape[1:]}")
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError("W1 needs at least one draw in each sample set")
    n, m = x.shape[0], y.shape[0]
    xs = np.sort(x.reshape(n, -1), axis=0)
    ys = y.reshape(m, -1) if y_sorted else np.sort(y.reshape(m, -1), axis=0)
    if n == m:
        return np.mean(np.abs(xs - ys), axis=0).reshape(x.shape[1:])
    # breakpoints i/n and j/m as exact fractions over n*m; u-cells between consecutive ones
    cuts = np.union1d(np.arange(n + 1) * m, np.arange(m + 1) * n)
    widths = np.diff(cuts) / (n * m)
    lower = cuts[:-1]  # on (lower, upper) the quantiles are x_(floor(lower m^-1 ...))
    ix = lower // m  # floor(u n) for u just above lower / (n m)
    iy = lower // n
    out = widths @ np.abs(xs[ix] - ys[iy])
    return out.reshape(x.shape[1:])


def marginal_error(samples, reference, reference_sorted: bool = False) -> float:
    """ME = (1/d) sum_i W1 between the i-th marginals of ``samples[n, d]`` and ``reference[m, d]``.

    Leading axes beyond the last are pooled (e.g. ``[chain, draw, d]``); ``reference_sorted``
    as ``y_sorted`` of :func:`wasserstein1`.
    """
    s = np.asarray(samples)
    r = np.asarray(reference)
    return float(np.mean(wasserstein1(s.reshape(-1, s.shape[-1]), r.reshape(-1, r.shape[-1]), reference_sorted)))


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


def relative_efficiency(bits, reference_bits) -> float:
    """Fraction of the communication saved relative to an uncompressed run: ``1 - b / b_ref``.

    ``b`` and ``b_ref`` are the mean numbers of bits sent per iteration by the method and by
    the uncompressed reference (LSD++, 32-bit floats, in QLSD Table 3). 0 means no saving,
    0.9 means ten times fewer bits; negative if the method sends more.

    Parameters
    ----------
    bits
        Bits per iteration of the method: a scalar, or an array (e.g. ``bits_up[chain, draw]``
        of a run) whose mean is taken.
    reference_bits
        Bits per iteration of the reference, idem.

    Notes
    -----
    Assumption: the exact definition of QLSD's "relative efficiency" column could not be
    retrieved (the paper's text was unavailable and the authors' public code only contains
    ``com_bits(s, d)``, the Elias-coding bound of QSGD, Alistarh et al., NeurIPS 2017,
    Theorem 3.2, for a message of ``d`` coordinates with ``s`` levels). We read it as the
    relative saving in bits per iteration; the compression factor ``b_ref / b`` is
    ``1 / (1 - relative_efficiency)``.
    """
    b = float(np.mean(np.asarray(bits, np.float64)))
    br = float(np.mean(np.asarray(reference_bits, np.float64)))
    if br <= 0:
        raise ValueError(f"reference bits per iteration must be > 0 (got {br})")
    return 1.0 - b / br
