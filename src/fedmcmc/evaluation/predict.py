"""Predictions of posterior draws: per-draw predictives, their model average, and potentials.

A sampler run gives draws ``theta[chain, draw, d]``; a :class:`fedmcmc.core.base.Model` with a
``predict(theta, inputs) -> probs[n, K]`` turns every draw into class probabilities
(:func:`predict_draws`), and their average over draws is the Bayesian model average
(:func:`bayes_average`, or :func:`predict_bma` without storing every draw), the Monte-Carlo
estimate of the posterior predictive ``p(y | x, D) = int p(y | x, theta) pi(theta | D) dtheta``.
:func:`pointwise_log_likelihood` gives ``log p(y_i | x_i, theta_s)`` of every draw and point
(ArviZ's ``log_likelihood`` group, from which LOO and WAIC are computed).
:func:`neg_log_posterior` gives the potential of every draw, whose quantiles define the HPD
regions of :mod:`fedmcmc.evaluation.hpd`.
"""

from __future__ import annotations

import functools

import numpy as np


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


@functools.lru_cache(maxsize=32)
def _pointwise(log_likelihood):
    """``(theta[B, d], data) -> [B, n]``, jitted once per log-likelihood function."""
    import jax

    return jax.jit(jax.vmap(jax.vmap(log_likelihood, in_axes=(None, 0)), in_axes=(0, None)))


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
    quantiles define the highest-posterior-density regions of :func:`~fedmcmc.evaluation.hpd.hpd_threshold`.

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


def pointwise_log_likelihood(model, samples, data, batch_size: int = 256) -> np.ndarray:
    """``log p(datum_i | theta_s)`` of every draw and datum: the ``log_likelihood`` group of ArviZ.

    Parameters
    ----------
    model
        A :class:`fedmcmc.core.base.Model`.
    samples
        Draws ``[..., d]`` (e.g. ``[chain, draw, d]``); the leading axes are kept.
    data
        A pytree of arrays with leading axis ``n``, one datum per row as
        ``model.log_likelihood`` takes it (``(x, y)`` for the regression and classification models).
    batch_size
        Number of draws evaluated at once.

    Returns
    -------
    numpy.ndarray
        ``[..., n]``, computed in float64 (draws and floating data converted): in float32 a point
        predicted with near certainty gets a log-likelihood of exactly 0 for every draw
        (``z - softplus(z)`` rounds to 0 for ``z > 17``), a constant column on which the Pareto
        smoothing of LOO fails.
    """
    import jax

    s = np.asarray(samples, np.float64)
    fn = _pointwise(model.log_likelihood)
    with jax.enable_x64(True):
        data64 = jax.tree_util.tree_map(
            lambda a: np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype, np.floating) else np.asarray(a),
            data)
        out = _batched_over_draws(lambda t: fn(t, data64), _flat_draws(s), batch_size)
    return out.reshape(s.shape[:-1] + out.shape[-1:])
