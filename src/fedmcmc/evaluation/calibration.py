"""Calibration of a classifier: reliability diagrams, binned ECE and accuracy above a confidence.

Probabilities and labels follow the conventions of :mod:`fedmcmc.evaluation.classification`.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple

import numpy as np

from fedmcmc.evaluation.classification import as_labels, as_probs


class Reliability(NamedTuple):
    """Binned calibration statistics (a reliability diagram).

    Attributes
    ----------
    edges
        ``[B + 1]`` bin edges on ``[0, 1]`` (equal width).
    confidence
        ``[B]`` mean confidence of the points in each bin (NaN for an empty bin).
    accuracy
        ``[B]`` accuracy of the points in each bin (NaN for an empty bin).
    counts
        ``[B]`` number of points in each bin.
    """

    edges: np.ndarray
    confidence: np.ndarray
    accuracy: np.ndarray
    counts: np.ndarray

    @property
    def ece(self) -> float:
        """``sum_b |B_b|/n |acc(B_b) - conf(B_b)|`` over the non-empty bins."""
        n = self.counts.sum()
        full = self.counts > 0
        gaps = np.abs(self.accuracy[full] - self.confidence[full])
        return float(np.sum(self.counts[full] / n * gaps))


def _confidence_correct(probs, y):
    p = as_probs(probs)
    labels = as_labels(y, p)
    if p.shape[0] == 0:
        raise ValueError("no points")
    return p.max(axis=1), (np.argmax(p, axis=1) == labels).astype(np.float64)


def reliability(probs, y, num_bins: int = 15) -> Reliability:
    """Reliability diagram: per-bin confidence, accuracy and count.

    Points are grouped by their confidence ``c_i = max_k p_ik`` into ``num_bins``
    equal-width bins ``B_b = (b/B, (b+1)/B]`` (the first bin also holds 0), as in Guo et al.,
    "On calibration of modern neural networks", ICML 2017; ``acc(B_b)`` is the
    fraction of correct predictions in the bin and ``conf(B_b)`` the mean confidence.
    A calibrated classifier has ``acc(B_b) = conf(B_b)`` in every bin.

    Parameters
    ----------
    probs, y
        As in :func:`~fedmcmc.evaluation.classification.accuracy`.
    num_bins
        ``B``.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1 (got {num_bins})")
    conf, correct = _confidence_correct(probs, y)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    # right-closed bins: the first index b with conf <= edges[b + 1]
    idx = np.clip(np.searchsorted(edges[1:-1], conf, side="left"), 0, num_bins - 1)
    counts = np.bincount(idx, minlength=num_bins)
    sum_conf = np.bincount(idx, weights=conf, minlength=num_bins)
    sum_acc = np.bincount(idx, weights=correct, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.where(counts > 0, sum_conf / np.maximum(counts, 1), np.nan)
        mean_acc = np.where(counts > 0, sum_acc / np.maximum(counts, 1), np.nan)
    return Reliability(edges, mean_conf, mean_acc, counts)


def ece(probs, y, num_bins: int = 15) -> float:
    """Expected calibration error with equal-width confidence bins.

    ``ECE = sum_b |B_b|/n |acc(B_b) - conf(B_b)|`` with the bins of :func:`reliability`
    (Naeini, Cooper & Hauskrecht, "Obtaining well calibrated probabilities using Bayesian
    binning", AAAI 2015; Guo et al., ICML 2017). 15 bins is the common choice.

    Parameters
    ----------
    probs, y
        As in :func:`~fedmcmc.evaluation.classification.accuracy`.
    num_bins
        ``B``.

    Notes
    -----
    The binned estimator is biased upwards by sampling noise (a perfectly calibrated
    classifier scores about ``sqrt(B / n)``), so compare ECEs computed on the same number of
    points. With ``num_bins=1`` the "ECE" collapses to ``|mean accuracy - mean confidence|``,
    which can be zero for a badly calibrated classifier whose over- and under-confident
    points cancel out; the QLSD authors' code defaults to one bin, so numbers computed that way
    are not comparable to the binned ECE.
    """
    return reliability(probs, y, num_bins).ece


def accuracy_vs_threshold(probs, y, thresholds) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy on the points predicted with confidence at least ``tau``, for each ``tau``.

    For each threshold ``tau``, ``S_tau = {i : max_k p_ik >= tau}``; returns the accuracy on
    ``S_tau`` and the fraction ``|S_tau| / n`` of points kept (the "confidence vs accuracy"
    curves of Lakshminarayanan et al., "Simple and scalable predictive uncertainty estimation
    using deep ensembles", NeurIPS 2017, and of the QLSD authors' code).
    A well-ranked uncertainty gives an accuracy that increases with ``tau``.

    Parameters
    ----------
    probs, y
        As in :func:`~fedmcmc.evaluation.classification.accuracy`.
    thresholds
        ``[T]`` values of ``tau``.

    Returns
    -------
    accuracy, fraction
        Two ``[T]`` arrays; the accuracy is NaN where no point reaches ``tau`` (the QLSD
        authors' code reports 1 there).
    """
    conf, correct = _confidence_correct(probs, y)
    taus = np.atleast_1d(np.asarray(thresholds, np.float64))
    kept = conf[None, :] >= taus[:, None]
    count = kept.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.where(count > 0, (kept * correct[None, :]).sum(axis=1) / np.maximum(count, 1), np.nan)
    return acc, count / conf.size


def plot_reliability(path: str | os.PathLike, methods: Mapping[str, Any], num_bins: int = 15,
                     title: str | None = None):
    """Reliability diagram of one or several methods, saved as a PNG.

    Parameters
    ----------
    path
        Output file.
    methods
        ``{label: Reliability}`` or ``{label: (probs, y)}`` (binned with ``num_bins``).
    num_bins
        Bins for the methods given as ``(probs, y)``.
    title
        Figure title.

    Returns
    -------
    pathlib.Path
        The written file. The top panel plots accuracy against mean confidence per non-empty
        bin, with the diagonal of perfect calibration and each method's ECE in the legend; the
        bottom panel shows the fraction of points per bin.
    """
    from fedmcmc.core.figures import new_figure, save_figure

    rels = {label: (m if isinstance(m, Reliability) else reliability(m[0], m[1], num_bins))
            for label, m in methods.items()}
    fig, (ax, axh) = new_figure(nrows=2, figsize=(5.5, 6.5), sharex=True,
                                gridspec_kw={"height_ratios": [3, 1]})
    ax.plot([0, 1], [0, 1], color="0.5", linestyle="--", linewidth=1, label="perfect calibration")
    for label, r in rels.items():
        full = r.counts > 0
        line, = ax.plot(r.confidence[full], r.accuracy[full], marker="o", markersize=4,
                        label=f"{label} (ECE {r.ece:.3f})")
        centres = 0.5 * (r.edges[:-1] + r.edges[1:])
        axh.step(centres, r.counts / max(r.counts.sum(), 1), where="mid", color=line.get_color())
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accuracy")
    ax.legend(loc="upper left", fontsize=8)
    if title:
        ax.set_title(title)
    axh.set_xlabel("confidence (max probability)")
    axh.set_ylabel("fraction")
    return save_figure(fig, path)
