"""Point, uncertainty and agreement metrics of a classifier's predictive probabilities.

Conventions, shared by every metric of :mod:`fedmcmc.evaluation` on probabilities
(:func:`as_probs`, :func:`as_labels`):

* ``probs`` is ``[n, K]`` (rows sum to one) and ``y`` holds integer labels in ``0..K-1``.
  A 1-D ``probs`` is read as the probability of class 1 of a binary problem.
* The prediction is the argmax (ties go to the lowest class index) and the confidence is the
  largest probability.

Point metrics: :func:`accuracy`, :func:`nll`, :func:`brier`. Uncertainty: :func:`entropy`,
:func:`auroc` (out-of-distribution detection). Agreement with a reference predictive:
:func:`agreement`, :func:`total_variation`.
"""

from __future__ import annotations

import numpy as np

#: Default clip for probabilities inside a logarithm (:func:`nll`).
NLL_EPS = 1e-12


def as_probs(probs) -> np.ndarray:
    """``probs`` as float64 ``[n, K]``; a 1-D ``probs`` becomes ``[1 - p, p]``."""
    p = np.asarray(probs, np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=-1)
    if p.ndim != 2:
        raise ValueError(f"expected probabilities [n, K] (or [n] for binary), got shape {p.shape}")
    return p


def as_labels(y, probs: np.ndarray) -> np.ndarray:
    """``y`` as int64 labels ``[n]``, checked to be integers in ``0..K-1`` of ``probs [n, K]``."""
    labels = np.asarray(y)
    if labels.shape != probs.shape[:1]:
        raise ValueError(f"labels of shape {labels.shape} for probabilities of shape {probs.shape}")
    if not np.all(labels == np.round(labels)):
        raise ValueError("labels must be integers")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= probs.shape[1]):
        raise ValueError(f"labels must lie in 0..{probs.shape[1] - 1}")
    return labels


def accuracy(probs, y) -> float:
    """Fraction of points whose predicted class ``argmax_k p_ik`` equals the label.

    Parameters
    ----------
    probs
        ``[n, K]`` class probabilities (``[n]``: probability of class 1).
    y
        ``[n]`` integer labels.
    """
    p = as_probs(probs)
    labels = as_labels(y, p)
    return float(np.mean(np.argmax(p, axis=1) == labels))


def nll(probs, y, eps: float = NLL_EPS) -> float:
    """Mean negative log predictive probability of the labels (the log loss).

    ``NLL = -(1/n) sum_i log p_{i, y_i}``, the negative log of the (posterior) predictive
    density of the test set per point, a strictly proper scoring rule (Gneiting & Raftery,
    "Strictly proper scoring rules, prediction, and estimation", JASA 2007).

    Parameters
    ----------
    probs, y
        As in :func:`accuracy`.
    eps
        Probabilities are clipped to ``[eps, 1]`` before the logarithm, so that a label given
        probability 0 costs ``-log(eps)`` (27.6 nats for the default 1e-12) instead of
        ``inf``. scikit-learn's ``log_loss`` clips in the same way (at the float epsilon).
    """
    p = as_probs(probs)
    labels = as_labels(y, p)
    picked = p[np.arange(p.shape[0]), labels]
    return float(-np.mean(np.log(np.clip(picked, eps, 1.0))))


def _one_hot(labels: np.ndarray, k: int) -> np.ndarray:
    out = np.zeros((labels.size, k))
    out[np.arange(labels.size), labels] = 1.0
    return out


def brier(probs, y) -> float:
    """Multi-class Brier score: ``(1/n) sum_i sum_k (p_ik - 1{y_i = k})^2``.

    This is Brier's original definition ("Verification of forecasts expressed in terms of
    probability", Monthly Weather Review, 1950), in ``[0, 2]``; it is the convention of the
    QLSD authors' code (``K * mean`` over the ``[n, K]`` squared errors). Some papers divide
    by ``K`` (mean over classes as well), and scikit-learn's binary ``brier_score_loss``
    scores the positive class only, which is half of this value for ``K = 2``.

    Parameters
    ----------
    probs, y
        As in :func:`accuracy`.
    """
    p = as_probs(probs)
    labels = as_labels(y, p)
    return float(np.mean(np.sum((p - _one_hot(labels, p.shape[1])) ** 2, axis=1)))


def entropy(probs) -> np.ndarray:
    """Predictive entropy of each point, in nats: ``H_i = -sum_k p_ik log p_ik`` (0 log 0 = 0).

    Applied to the model average it is the total predictive uncertainty (Depeweg et al.,
    "Decomposition of uncertainty in Bayesian deep learning", ICML 2018); it lies in
    ``[0, log K]``.

    Parameters
    ----------
    probs
        ``[n, K]`` (``[n]``: probability of class 1).

    Returns
    -------
    numpy.ndarray
        ``[n]``.
    """
    p = as_probs(probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -terms.sum(axis=1)


def auroc(scores_in, scores_out) -> float:
    """Area under the ROC curve separating out-of-distribution (positive) from in-distribution points.

    With a score where larger means "more likely OOD" (the predictive :func:`entropy`), the
    AUROC is the Mann-Whitney probability ``P(s_out > s_in) + P(s_out = s_in) / 2`` over pairs
    (Hanley & McNeil, "The meaning and use of the area under a ROC curve", Radiology 1982),
    computed from mid-ranks; it equals ``sklearn.metrics.roc_auc_score`` with OOD labelled 1.
    The QLSD authors' code counts ties as 1 instead of 1/2 (identical unless scores tie).

    Parameters
    ----------
    scores_in
        ``[n_in]`` scores of in-distribution points (negatives).
    scores_out
        ``[n_out]`` scores of OOD points (positives).
    """
    from scipy.stats import rankdata

    a = np.asarray(scores_in, np.float64).ravel()
    b = np.asarray(scores_out, np.float64).ravel()
    if a.size == 0 or b.size == 0:
        raise ValueError("AUROC needs at least one in-distribution and one OOD score")
    ranks = rankdata(np.concatenate([a, b]))  # average ranks for ties
    u = ranks[a.size:].sum() - b.size * (b.size + 1) / 2.0
    return float(u / (a.size * b.size))


def agreement(probs, ref_probs) -> float:
    """Fraction of points whose predicted class equals the reference's: ``(1/n) sum_i 1{argmax p_i = argmax q_i}``.

    Izmailov, Vikram, Hoffman & Wilson, "What are Bayesian neural network posteriors really
    like?", ICML 2021 (agreement with the HMC reference predictive); the QLSD supplement
    (Vono et al., AISTATS 2022) compares its samplers' predictives with a reference sampler's
    in the same way. In ``[0, 1]``, 1 when every predicted class matches.
    """
    p, q = as_probs(probs), as_probs(ref_probs)
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {p.shape} and {q.shape}")
    return float(np.mean(np.argmax(p, axis=1) == np.argmax(q, axis=1)))


def total_variation(probs, ref_probs) -> float:
    """Mean total-variation distance between predictive distributions: ``(1/n) sum_i (1/2) sum_k |p_ik - q_ik|``.

    Izmailov et al., ICML 2021; used with :func:`agreement` against a reference predictive.
    In ``[0, 1]``, 0 when the predictives are equal.
    """
    p, q = as_probs(probs), as_probs(ref_probs)
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {p.shape} and {q.shape}")
    return float(np.mean(0.5 * np.abs(p - q).sum(axis=1)))
