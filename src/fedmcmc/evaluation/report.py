"""The scalar predictive metrics of a classifier gathered for ``results.json``, and any metric per
client and over all clients' points (:func:`by_client`)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fedmcmc.evaluation.calibration import ece
from fedmcmc.evaluation.classification import (NLL_EPS, accuracy, agreement, as_probs, auroc, brier, entropy, nll,
                                               total_variation)
from fedmcmc.evaluation.predict import bayes_average


def classification_report(probs, y, num_bins: int = 15, ref_probs=None, ood_probs=None,
                          eps: float = NLL_EPS) -> dict:
    """Scalar predictive metrics of a classifier, as a dict for ``results.json``.

    Parameters
    ----------
    probs
        Per-draw probabilities ``[S, n, K]`` (averaged first:
        :func:`~fedmcmc.evaluation.predict.bayes_average`) or the predictive ``[n, K]`` itself.
    y
        ``[n]`` labels.
    num_bins
        Bins of the ECE.
    ref_probs
        Optional reference predictive ``[n, K]`` (or per-draw ``[S', n, K]``): adds
        ``agreement`` and ``total_variation``.
    ood_probs
        Optional predictive on out-of-distribution inputs (``[m, K]`` or ``[S, m, K]``): adds
        ``auroc_entropy`` (OOD detection by predictive entropy) and ``mean_entropy_ood``.
    eps
        Clip of :func:`~fedmcmc.evaluation.classification.nll`.

    Returns
    -------
    dict
        ``accuracy`` (of the model average; the accuracy of the posterior-mean parameter is
        the caller's), ``nll``, ``brier``, ``ece``, ``mean_entropy``, ``num_points``,
        ``num_draws`` (None for a predictive given directly), ``ece_bins``, plus the optional
        keys above.
    """
    arr = np.asarray(probs)
    num_draws = None
    if arr.ndim == 3:
        num_draws = int(arr.shape[0])
        arr = bayes_average(arr)
    p = as_probs(arr)
    h = entropy(p)
    out = {
        "accuracy": accuracy(p, y),
        "nll": nll(p, y, eps),
        "brier": brier(p, y),
        "ece": ece(p, y, num_bins),
        "mean_entropy": float(h.mean()),
        "num_points": int(p.shape[0]),
        "num_draws": num_draws,
        "ece_bins": int(num_bins),
    }
    if ref_probs is not None:
        r = np.asarray(ref_probs)
        r = bayes_average(r) if r.ndim == 3 else r
        out["agreement"] = agreement(p, r)
        out["total_variation"] = total_variation(p, r)
    if ood_probs is not None:
        o = np.asarray(ood_probs)
        o = bayes_average(o) if o.ndim == 3 else o
        h_ood = entropy(o)
        out["auroc_entropy"] = auroc(h, h_ood)
        out["mean_entropy_ood"] = float(h_ood.mean())
    return out


def by_client(metric: Callable[..., dict], parts: Sequence[tuple]) -> dict:
    """``metric`` on each client's arrays and on all clients' together.

    Parameters
    ----------
    metric
        ``metric(*arrays) -> dict``, e.g. :func:`classification_report` on ``(probs, y)``.
    parts
        One tuple of arrays per client (leading axis: the client's points).

    Returns
    -------
    dict
        ``{"clients": [metric(*part) for part in parts], "overall": metric(*pooled)}``, where
        ``pooled`` concatenates the clients' arrays position by position.
    """
    if not parts:
        raise ValueError("no clients to report on")
    pooled = tuple(np.concatenate(arrays) for arrays in zip(*parts))
    return {"clients": [metric(*part) for part in parts], "overall": metric(*pooled)}
