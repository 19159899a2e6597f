"""Predictive, calibration and uncertainty metrics for Bayesian classifiers.

A sampler run gives draws ``theta[chain, draw, d]``; a :class:`fedmcmc.core.base.Model` with a
``predict(theta, inputs) -> probs[n, K]`` turns every draw into class probabilities
(:func:`predict_draws`), and their average over draws is the Bayesian model average
(:func:`bayes_average`), the Monte-Carlo estimate of the posterior predictive
``p(y | x, D) = int p(y | x, theta) pi(theta | D) dtheta``.

Conventions, shared by every metric below:

* ``probs`` is ``[n, K]`` (rows sum to one) and ``y`` holds integer labels in ``0..K-1``.
  A 1-D ``probs`` is read as the probability of class 1 of a binary problem.
* The prediction is the argmax (ties go to the lowest class index) and the confidence is the
  largest probability.

Point metrics: :func:`accuracy`, :func:`nll`, :func:`brier`. Calibration: :func:`ece`,
:func:`reliability`, :func:`plot_reliability`, :func:`accuracy_vs_threshold`. Uncertainty:
:func:`entropy`, :func:`auroc` (out-of-distribution detection). Agreement with a reference
predictive: :func:`agreement`, :func:`total_variation`. The QLSD Bayesian logistic regression
table: :func:`hpd_threshold`, :func:`hpd_relative_error`, :func:`relative_efficiency` (and the
per-coordinate alternative :func:`hpd_interval`, :func:`marginal_hpd_relative_error`).
:func:`classification_report` gathers the scalar metrics for ``results.json``.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any, Mapping, NamedTuple

import numpy as np

#: Default clip for probabilities inside a logarithm (:func:`nll`).
NLL_EPS = 1e-12


# ----------------------------------------------------------------------------- predictions


def _flat_draws(samples) -> np.ndarray:
    s = np.asarray(samples)
    if s.ndim == 1:
        return s[None, :]
    return s.reshape(-1, s.shape[-1])


def _batched_over_draws(fn, theta: np.ndarray, batch_size: int, reduce_mean: bool = False):
    """Apply the jitted ``fn(theta_batch[B, d]) -> out[B, ...]`` over batches of draws.

    The last batch is padded with copies of the last draw so that ``fn`` compiles once.
    Returns the stacked outputs ``[S, ...]``, or their mean over draws if ``reduce_mean``.
    """
    import jax.numpy as jnp

    num = theta.shape[0]
    if num == 0:
        raise ValueError("no draws to predict with")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    b = min(int(batch_size), num)
    out = None
    total = None
    for start in range(0, num, b):
        chunk = theta[start:start + b]
        real = chunk.shape[0]
        if real < b:
            chunk = np.concatenate([chunk, np.repeat(chunk[-1:], b - real, axis=0)], axis=0)
        res = np.asarray(fn(jnp.asarray(chunk)))[:real]
        if reduce_mean:
            part = res.astype(np.float64).sum(axis=0)
            total = part if total is None else total + part
        else:
            if out is None:
                out = np.empty((num,) + res.shape[1:], dtype=res.dtype)
            out[start:start + real] = res
    return total / num if reduce_mean else out


def _vmapped_predict(model):
    if model.predict is None:
        raise ValueError(f"model {model.name!r} has no predict function")
    return _jit_over_draws(model.predict)


@functools.lru_cache(maxsize=32)
def _jit_over_draws(predict):
    """One jitted ``vmap`` per predict function, so repeated calls do not compile again."""
    import jax

    return jax.jit(jax.vmap(predict, in_axes=(0, None)))


def predict_draws(model, samples, inputs, batch_size: int = 256) -> np.ndarray:
    """Predictions of every posterior draw: ``probs[S, n, K]``.

    Parameters
    ----------
    model
        A :class:`fedmcmc.core.base.Model` with a ``predict(theta, inputs)`` function.
    samples
        Draws ``[chain, draw, d]`` (any leading axes, flattened in C order to ``S`` draws),
        ``[S, d]`` or a single ``[d]``.
    inputs
        The inputs, passed unchanged to ``model.predict`` (array or pytree with leading axis ``n``).
    batch_size
        Number of draws evaluated at once (``jit`` of a ``vmap`` over draws); bounds the
        memory of one evaluation to ``batch_size * n * K`` values. The last batch is padded
        so that the function compiles once.

    Returns
    -------
    numpy.ndarray
        ``model.predict(theta_s, inputs)`` for each draw ``s``, stacked on axis 0.

    Notes
    -----
    The stacked array holds ``S * n * K`` values; for the model average alone,
    :func:`predict_bma` accumulates the mean without storing it.
    """
    fn = _vmapped_predict(model)
    theta = _flat_draws(samples)
    return _batched_over_draws(lambda t: fn(t, inputs), theta, batch_size)


def predict_bma(model, samples, inputs, batch_size: int = 256) -> np.ndarray:
    """Bayesian model average ``(1/S) sum_s predict(theta_s, inputs)`` without storing every draw.

    Same arguments as :func:`predict_draws`; equals ``bayes_average(predict_draws(...))``
    (accumulated in float64).
    """
    fn = _vmapped_predict(model)
    theta = _flat_draws(samples)
    return _batched_over_draws(lambda t: fn(t, inputs), theta, batch_size, reduce_mean=True)


def bayes_average(probs_draws) -> np.ndarray:
    """Bayesian model average (BMA) of per-draw predictive probabilities.

    ``p_hat(y | x) = (1/S) sum_s p(y | x, theta_s)``, the Monte-Carlo estimate of the
    posterior predictive ``int p(y | x, theta) pi(theta | D) dtheta`` from draws
    ``theta_s ~ pi(. | D)`` (e.g. Wilson & Izmailov, "Bayesian deep learning and a
    probabilistic perspective of generalization", NeurIPS 2020, Eq. 1).

    Parameters
    ----------
    probs_draws
        ``[S, n, K]`` (or ``[S, n]`` for regression means / binary probabilities).

    Returns
    -------
    numpy.ndarray
        The average over axis 0, in float64.
    """
    p = np.asarray(probs_draws, np.float64)
    if p.ndim < 2:
        raise ValueError(f"expected per-draw predictions [S, n, ...], got shape {p.shape}")
    return p.mean(axis=0)


def neg_log_posterior(model, samples, data, batch_size: int = 256) -> np.ndarray:
    """Potential ``U(theta) = -log prior(theta) - sum_j log p(x_j | theta)`` of every draw.

    This is ``-log pi(theta | D)`` up to the (unknown) log evidence, the quantity whose
    quantiles define the highest-posterior-density regions of :func:`hpd_threshold`.

    Parameters
    ----------
    model
        A :class:`fedmcmc.core.base.Model`.
    samples
        Draws ``[..., d]`` (leading axes flattened).
    data
        All the data: a pytree of arrays with leading axis ``N`` (one datum per row, as
        ``model.log_likelihood`` takes it).
    batch_size
        Number of draws evaluated at once.

    Returns
    -------
    numpy.ndarray
        ``U`` for each draw, shape ``[S]`` (float64).
    """
    import jax

    def potential(theta):
        ll = jax.vmap(model.log_likelihood, in_axes=(None, 0))(theta, data)
        return -(model.log_prior(theta) + ll.sum())

    fn = jax.jit(jax.vmap(potential))
    return _batched_over_draws(fn, _flat_draws(samples), batch_size).astype(np.float64)


# ----------------------------------------------------------------------------- point metrics


def _as_probs(probs) -> np.ndarray:
    p = np.asarray(probs, np.float64)
    if p.ndim == 1:
        p = np.stack([1.0 - p, p], axis=-1)
    if p.ndim != 2:
        raise ValueError(f"expected probabilities [n, K] (or [n] for binary), got shape {p.shape}")
    return p


def _as_labels(y, probs: np.ndarray) -> np.ndarray:
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
    p = _as_probs(probs)
    labels = _as_labels(y, p)
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
    p = _as_probs(probs)
    labels = _as_labels(y, p)
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
    p = _as_probs(probs)
    labels = _as_labels(y, p)
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
    p = _as_probs(probs)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
    return -terms.sum(axis=1)


# ----------------------------------------------------------------------------- calibration


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
    p = _as_probs(probs)
    labels = _as_labels(y, p)
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
        As in :func:`accuracy`.
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
        As in :func:`accuracy`.
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
        As in :func:`accuracy`.
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
    from fedmcmc.runtime.io import new_figure, save_figure

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


# ----------------------------------------------------------------------------- OOD detection


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


# ----------------------------------------------------------------------------- reference predictive


def agreement(probs, ref_probs) -> float:
    """Fraction of points whose predicted class equals the reference's: ``(1/n) sum_i 1{argmax p_i = argmax q_i}``.

    Izmailov, Vikram, Hoffman & Wilson, "What are Bayesian neural network posteriors really
    like?", ICML 2021 (agreement with the HMC reference predictive); the QLSD supplement
    (Vono et al., AISTATS 2022) compares its samplers' predictives with a reference sampler's
    in the same way. In ``[0, 1]``, 1 when every predicted class matches.
    """
    p, q = _as_probs(probs), _as_probs(ref_probs)
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {p.shape} and {q.shape}")
    return float(np.mean(np.argmax(p, axis=1) == np.argmax(q, axis=1)))


def total_variation(probs, ref_probs) -> float:
    """Mean total-variation distance between predictive distributions: ``(1/n) sum_i (1/2) sum_k |p_ik - q_ik|``.

    Izmailov et al., ICML 2021; used with :func:`agreement` against a reference predictive.
    In ``[0, 1]``, 0 when the predictives are equal.
    """
    p, q = _as_probs(probs), _as_probs(ref_probs)
    if p.shape != q.shape:
        raise ValueError(f"shapes differ: {p.shape} and {q.shape}")
    return float(np.mean(0.5 * np.abs(p - q).sum(axis=1)))


# ----------------------------------------------------------------------------- QLSD Table 3


def hpd_threshold(potentials, level: float = 0.99) -> float:
    """Threshold ``eta_alpha`` of the highest-posterior-density region of credibility ``level``.

    The HPD region of a posterior ``pi(theta) ∝ exp(-U(theta))`` is
    ``C_alpha = {theta : U(theta) <= eta_alpha}``, with ``eta_alpha`` chosen so that
    ``pi(C_alpha) = alpha`` (Robert, "The Bayesian choice", 2007; Pereyra,
    "Maximum-a-posteriori estimation with Bayesian confidence regions", SIAM J. Imaging Sci.
    2017). Since ``U(theta)`` with ``theta ~ pi`` has distribution function
    ``P(U <= eta) = pi(C)``, ``eta_alpha`` is the ``alpha``-quantile of the potential values of
    posterior draws (:func:`neg_log_posterior`).

    Parameters
    ----------
    potentials
        ``U(theta_s)`` for the draws (any shape, pooled).
    level
        ``alpha`` in ``(0, 1)``.
    """
    u = np.asarray(potentials, np.float64).ravel()
    if u.size == 0:
        raise ValueError("no potential values")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    return float(np.quantile(u, level))


def hpd_relative_error(potentials, reference_potentials, level: float = 0.99) -> float:
    """Relative error of the HPD region threshold, ``|eta_alpha - eta_alpha^ref| / |eta_alpha^ref|``.

    The "HPD relative error" of QLSD Table 3 (Vono, Plassier, Durmus, Dieuleveut & Moulines,
    "QLSD: Quantised Langevin stochastic dynamics for Bayesian federated learning", AISTATS
    2022, Section 5, Bayesian logistic regression), following Durmus, Moulines & Pereyra,
    "Efficient Bayesian computation by proximal MCMC", SIAM J. Imaging Sci. 2018:
    ``eta_alpha`` is the threshold of :func:`hpd_threshold`, from a method's draws and from a
    reference sampler's draws (MALA / LSD++ in the paper), at ``alpha = 0.99``.

    Parameters
    ----------
    potentials
        ``U(theta)`` (:func:`neg_log_posterior`) of the method's draws.
    reference_potentials
        ``U(theta)`` of the reference draws, computed with the same ``U`` (same data, same
        additive constant: the error is relative, so it depends on the constant dropped from
        ``-log pi``; use the same function for both).
    level
        ``alpha``.

    Notes
    -----
    Source of the definition: the paper text was not retrievable here; the authors' public
    code (github.com/VincentPlassier/QLSD, ``src/notebook_logistic_regression.ipynb``, cell
    "HPD error") computes ``eta`` as quantiles of the chain's negative log posterior
    ``-log-likelihood + tau/2 ||theta||^2`` and reports ``|eta - eta_ref| / eta_ref``, which is
    what this function does. A per-coordinate reading (widths of marginal HPD intervals) is
    :func:`marginal_hpd_relative_error`.
    """
    eta = hpd_threshold(potentials, level)
    eta_ref = hpd_threshold(reference_potentials, level)
    if eta_ref == 0.0:
        raise ValueError("the reference threshold is 0: the relative error is undefined")
    return float(abs(eta - eta_ref) / abs(eta_ref))


def hpd_interval(samples, level: float = 0.99) -> tuple[np.ndarray, np.ndarray]:
    """Shortest interval holding a fraction ``level`` of the draws, for each coordinate.

    The empirical HPD interval of Chen & Shao, "Monte Carlo estimation of Bayesian credible
    and HPD intervals", J. Comput. Graph. Stat. 1999: among the windows
    ``[x_(j), x_(j + m - 1)]`` of ``m = ceil(level * n)`` consecutive order statistics, the
    shortest. It estimates the HPD interval of a unimodal marginal (for ``N(mu, sigma^2)``:
    ``mu ± z_{(1 + level)/2} sigma``, length ``2 * 2.5758 sigma`` at 99 %).

    Parameters
    ----------
    samples
        ``[..., d]`` draws (leading axes pooled); a 1-D array is one coordinate.
    level
        Credibility in ``(0, 1)``.

    Returns
    -------
    lower, upper
        ``[d]`` arrays (scalars' shape ``()`` for 1-D input).
    """
    x = np.asarray(samples, np.float64)
    one = x.ndim == 1
    x2 = x.reshape(-1, 1) if one else x.reshape(-1, x.shape[-1])
    n = x2.shape[0]
    if n == 0:
        raise ValueError("no draws")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1) (got {level})")
    m = max(1, min(n, math.ceil(level * n - 1e-9)))
    xs = np.sort(x2, axis=0)
    widths = xs[m - 1:] - xs[:n - m + 1]
    j = np.argmin(widths, axis=0)
    cols = np.arange(x2.shape[1])
    lo, hi = xs[j, cols], xs[j + m - 1, cols]
    return (lo[0], hi[0]) if one else (lo, hi)


def marginal_hpd_relative_error(samples, reference, level: float = 0.99) -> float:
    """Mean over coordinates of the relative error of the marginal HPD interval length.

    ``(1/d) sum_i |w_i - w_i^ref| / w_i^ref`` with ``w_i`` the length of the
    :func:`hpd_interval` of coordinate ``i``. A per-coordinate alternative to
    :func:`hpd_relative_error` (which is the QLSD paper's definition): it checks the spread
    of each marginal, not the location.

    Parameters
    ----------
    samples, reference
        ``[..., d]`` draws of the method and of the reference.
    level
        Credibility of the intervals.
    """
    lo, hi = hpd_interval(samples, level)
    rlo, rhi = hpd_interval(reference, level)
    w, wr = np.atleast_1d(hi - lo), np.atleast_1d(rhi - rlo)
    if np.any(wr <= 0):
        raise ValueError("a reference HPD interval has zero length")
    return float(np.mean(np.abs(w - wr) / wr))


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


# ----------------------------------------------------------------------------- report


def classification_report(probs, y, num_bins: int = 15, ref_probs=None, ood_probs=None,
                          eps: float = NLL_EPS) -> dict:
    """Scalar predictive metrics of a classifier, as a dict for ``results.json``.

    Parameters
    ----------
    probs
        Per-draw probabilities ``[S, n, K]`` (averaged first: :func:`bayes_average`) or the
        predictive ``[n, K]`` itself.
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
        Clip of :func:`nll`.

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
    p = _as_probs(arr)
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
