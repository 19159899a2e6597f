"""Posterior predictive of a regression model: its mean, a central interval, and the metrics of a test set.

A regression :class:`~fedmcmc.core.base.Model` gives, per draw ``theta_s``, a predictive mean
``mu_s(x) = predict(theta_s, x)`` and a likelihood ``p(y | x, theta_s)``. The observation noise
of a draw is read from the likelihood's curvature in ``y`` at its mean,
``sigma_s^2(x) = -1 / d^2/dy^2 log p(y | x, theta_s) |_{y = mu_s(x)}`` (exact for Gaussian noise,
as in :func:`~fedmcmc.models.linear_regression`; the Laplace approximation otherwise), so the
posterior predictive is the mixture ``(1/S) sum_s N(mu_s(x), sigma_s^2(x))`` and its central
interval of probability ``level`` runs between the mixture's ``(1 - level)/2`` and
``(1 + level)/2`` quantiles (:func:`predictive_interval`).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from fedmcmc.evaluation.predict import _batched_over_draws, _flat_draws, pointwise_log_likelihood


class RegressionPredictive(NamedTuple):
    """The posterior predictive of each input: ``mean``, and the interval ``[lower, upper]``
    holding probability ``level`` (arrays ``[n]``)."""

    mean: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    level: float


@functools.lru_cache(maxsize=32)
def _mean_and_noise(predict, log_likelihood):
    """``(theta[B, d], x) -> [B, 2, n]``: each draw's predictive means and noise variances."""
    import jax
    import jax.numpy as jnp

    def one(theta, x):
        mu = predict(theta, x)
        curvature = jax.vmap(lambda xi, yi: jax.grad(jax.grad(lambda y: log_likelihood(theta, (xi, y))))(yi))(x, mu)
        return jnp.stack([mu, -1.0 / curvature])

    return jax.jit(jax.vmap(one, in_axes=(0, None)))


def predictive_draws(model, samples, x, batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Each draw's predictive means and noise variances, two ``[S, n]`` arrays (float64).

    Raises ``ValueError`` if the model has no ``predict`` or its log-likelihood is not concave
    in ``y`` at a predictive mean (no Gaussian noise to read).
    """
    if model.predict is None:
        raise ValueError(f"model {model.name!r} has no predict function")
    fn = _mean_and_noise(model.predict, model.log_likelihood)
    out = _batched_over_draws(lambda t: fn(t, x), _flat_draws(samples), batch_size).astype(np.float64)
    mu, var = out[:, 0], out[:, 1]
    if not np.all(np.isfinite(var) & (var > 0)):
        raise ValueError(f"model {model.name!r}: the log-likelihood is not concave in y at the predictive mean, "
                         "so it has no noise scale to give an interval; is it a regression model?")
    return mu, var


def mixture_quantiles(mu, var, probs, iterations: int = 60, rtol: float = 1e-12) -> np.ndarray:
    """Quantiles of ``(1/S) sum_s N(mu_s, var_s)`` for each column of ``mu, var [S, n]``: ``[len(probs), n]``.

    The ``p``-quantile lies between the smallest and the largest of the components' own
    ``p``-quantiles ``mu_s + z_p sigma_s``; inside that bracket, Newton's steps on the mixture's
    CDF (its density the derivative), a bisection wherever a step would leave the bracket, which
    shrinks at every iteration; at most ``iterations`` of them, until the steps are below ``rtol``
    of the mixture's scale.
    """
    from scipy.special import ndtr, ndtri

    mu, sd = np.asarray(mu, np.float64), np.sqrt(np.asarray(var, np.float64))
    scale = np.sqrt(np.mean(sd**2, axis=0) + np.var(mu, axis=0))
    out = []
    for p in np.atleast_1d(probs):
        own = mu + ndtri(p) * sd
        lo, hi = own.min(axis=0), own.max(axis=0)
        x = np.clip(mu.mean(axis=0) + ndtri(p) * scale, lo, hi)
        for _ in range(iterations):
            t = (x - mu) / sd
            excess = ndtr(t).mean(axis=0) - p
            density = np.mean(np.exp(-0.5 * t**2) / sd, axis=0) / np.sqrt(2 * np.pi)
            lo, hi = np.where(excess < 0, x, lo), np.where(excess < 0, hi, x)
            with np.errstate(divide="ignore", invalid="ignore"):
                newton = x - excess / density
            step = np.where((newton > lo) & (newton < hi), newton, 0.5 * (lo + hi))
            done = np.all(np.abs(step - x) <= rtol * scale)
            x = step
            if done:
                break
        out.append(x)
    return np.stack(out)


def predictive_interval(model, samples, x, level: float = 0.94, batch_size: int = 256) -> RegressionPredictive:
    """The posterior predictive mean and central ``level`` interval of ``y`` at each input (module docstring)."""
    if not 0 < level < 1:
        raise ValueError(f"the interval's level must lie in (0, 1) (got {level})")
    mu, var = predictive_draws(model, samples, x, batch_size)
    lower, upper = mixture_quantiles(mu, var, [(1 - level) / 2, (1 + level) / 2])
    return RegressionPredictive(mu.mean(axis=0), lower, upper, float(level))


def rmse(mean, y) -> float:
    """Root mean squared error ``sqrt((1/n) sum_i (mean_i - y_i)^2)`` of the predictive mean."""
    return float(np.sqrt(np.mean((np.asarray(mean, np.float64) - np.asarray(y, np.float64)) ** 2)))


def log_predictive_density(log_likelihood) -> np.ndarray:
    """``log (1/S) sum_s p(y_i | theta_s)`` of each point from ``log_likelihood[..., n]`` (draws on the leading axes)."""
    from scipy.special import logsumexp

    ll = np.asarray(log_likelihood, np.float64)
    ll = ll.reshape(-1, ll.shape[-1])
    return logsumexp(ll, axis=0) - np.log(ll.shape[0])


def regression_points(model, samples, x, y, level: float = 0.94, batch_size: int = 256) -> tuple:
    """``(mean, lower, upper, log_density, y)`` of each test point: the predictive mean and central
    ``level`` interval (:func:`predictive_interval`) and the log posterior predictive density
    (:func:`log_predictive_density`); what :func:`regression_metrics` needs, point by point, so that
    the points of several clients can be pooled without their inputs."""
    pred = predictive_interval(model, samples, x, level, batch_size)
    y = np.asarray(y, np.float64)
    ll = pointwise_log_likelihood(model, _flat_draws(samples), (x, y), batch_size)
    return pred.mean, pred.lower, pred.upper, log_predictive_density(ll), y


def regression_metrics(mean, lower, upper, log_density, y, level: float, num_draws: int) -> dict:
    """:func:`regression_report`'s dict from :func:`regression_points`'s arrays."""
    y = np.asarray(y, np.float64)
    return {"rmse": rmse(mean, y), "nll": float(-np.mean(log_density)),
            "coverage": float(np.mean((lower <= y) & (y <= upper))), "interval_level": float(level),
            "num_points": int(y.shape[0]), "num_draws": int(num_draws)}


def regression_report(model, samples, x, y, level: float = 0.94, batch_size: int = 256) -> dict:
    """Scalar predictive metrics of a regression model on a test set, as a dict for ``summary.json``.

    Returns
    -------
    dict
        ``rmse`` of the predictive mean, ``nll`` (minus the mean log posterior predictive
        density of the points, :func:`log_predictive_density`), ``coverage`` (the fraction of
        points inside the central ``level`` interval of :func:`predictive_interval`),
        ``interval_level``, ``num_points`` and ``num_draws``.
    """
    points = regression_points(model, samples, x, y, level, batch_size)
    return regression_metrics(*points, level=level, num_draws=_flat_draws(samples).shape[0])
