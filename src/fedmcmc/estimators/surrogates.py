"""Gaussian surrogates of the shards' local densities, for conducive gradients (CG-DSGLD).

Shard ``s`` approximates its share of the posterior,

    q_s(theta) ≈ p(theta)^{f_s} prod_{x in x_s} p(x | theta),

by a Gaussian kept in natural form, ``log q_s(theta) = -theta' L_s theta / 2 + e_s' theta + c``,
with precision ``L_s`` (full ``[d, d]`` or diagonal ``[d]``) and shift ``e_s = L_s mu_s``, so that
``grad log q_s(theta) = e_s - L_s theta`` and the product ``q = prod_s q_s`` has ``L = sum_s L_s``
and ``e = sum_s e_s``: combining surrogates is a sum. The prior share ``p(theta)^{f_s}`` keeps
every local density proper (a shard of a logistic regression may be separable) and, since the
shares multiply to the prior, changes nothing in the conducive gradient's exactness on
Gaussian models (see :mod:`fedmcmc.samplers.dsgld`). ``share = 0`` fits the local likelihood
alone (``dsgld(..., likelihood_only=True)``, El Mekkaoui et al.'s Section 5.3).

Three ways to fit ``q_s`` where the data lives, each ``fit(key, model, client_data, theta0, share)``:

- :func:`taylor`: the second-order expansion of the local log-density at ``theta0``. Exact for
  conjugate Gaussian models (Gaussian mean, linear regression with known noise), whose
  log-likelihood is quadratic: the analytic surrogate.
- :func:`laplace`: the same expansion at the local mode, found by damped Newton steps
  (beyond El Mekkaoui et al.).
- :func:`sgld_moments`: the mean and covariance (full or diagonal) of local Langevin samples,
  El Mekkaoui et al.'s choice; the precision is the inverse of the sample covariance.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.estimators import gradients
from fedmcmc.core.base import ClientData, Model
from fedmcmc.core.types import Array

COVARIANCES = ("full", "diag")


class GaussianSurrogate(NamedTuple):
    """A Gaussian in natural form: ``precision`` ([d, d], or [d] if diagonal) and ``shift = precision @ mean``."""

    precision: Array
    shift: Array

    @property
    def diagonal(self) -> bool:
        return self.precision.ndim == self.shift.ndim

    def grad_log(self, theta):
        """``grad log q(theta) = shift - precision theta``."""
        return self.shift - matvec(self.precision, theta)

    def mean(self):
        """``mu = precision^{-1} shift``."""
        if self.diagonal:
            return self.shift / self.precision
        return jnp.linalg.solve(self.precision, self.shift)


def matvec(precision, theta):
    """``precision @ theta`` for a full ``[d, d]`` or diagonal ``[d]`` precision."""
    return precision * theta if precision.ndim == theta.ndim else precision @ theta


def symmetric(precision):
    """A full precision made exactly symmetric, ``(L + L^T) / 2`` (the matrix that
    ``grad log q`` uses: the gradient of ``theta^T L theta / 2`` is the symmetric part's);
    a diagonal one as it is. An eigendecomposition product ``V diag(l) V^T`` is symmetric
    only up to rounding."""
    return precision if precision.ndim == 1 else 0.5 * (precision + precision.T)


class Packed(NamedTuple):
    """A symmetric ``[d, d]`` matrix on the wire: its ``d (d + 1) / 2`` entries on and above
    the diagonal, row by row."""

    upper: Array


def pack(q: GaussianSurrogate) -> GaussianSurrogate:
    """The surrogate as it travels: a full precision as :class:`Packed` (what
    :func:`surrogate_bits` counts), a diagonal one as it is."""
    if q.diagonal:
        return q
    rows, cols = np.triu_indices(q.shift.shape[-1])
    return GaussianSurrogate(Packed(q.precision[rows, cols]), q.shift)


def unpack(q: GaussianSurrogate) -> GaussianSurrogate:
    """Inverse of :func:`pack` (exact: entries are copied, not computed)."""
    if not isinstance(q.precision, Packed):
        return q
    d = q.shift.shape[-1]
    rows, cols = np.triu_indices(d)
    upper = jnp.zeros((d, d), q.shift.dtype).at[rows, cols].set(q.precision.upper)
    return GaussianSurrogate(jnp.where(np.tri(d, dtype=bool), upper.T, upper), q.shift)


def product(surrogates: GaussianSurrogate) -> GaussianSurrogate:
    """``q = prod_s q_s`` of surrogates stacked on a leading shard axis: natural parameters add."""
    return GaussianSurrogate(jnp.sum(surrogates.precision, axis=0), jnp.sum(surrogates.shift, axis=0))


def describe(fit) -> tuple[str, str]:
    """``(what, remedy)`` of a fitter: what it is (``surrogate = "sgld", ...``) and what to change
    when its fit fails; generic for a fitter not made here."""
    return (getattr(fit, "what", "a custom surrogate fitter"),
            getattr(fit, "remedy", "check that shard's data for extreme values, standardise the features (and a "
                                   "regression's response), or choose another [sampler] surrogate"))


def _named(fit, what: str, remedy: str):
    fit.what, fit.remedy = what, remedy
    return fit


def check(precision, shift, shard: int, fit=None) -> None:
    """Raise a one-line ``ValueError`` naming shard ``shard`` and its fitter ``fit`` (:func:`describe`)
    unless its surrogate (natural parameters ``precision`` and ``shift``, NumPy arrays with any
    leading axes, e.g. chains) is a proper Gaussian: finite, its precision symmetric and positive
    definite (up to float32 rounding: eigenvalues above ``-d eps max|l|``), its mean finite. The
    message gives the fitter's own remedy, not the sampler's step."""
    precision, shift = np.asarray(precision, np.float64), np.asarray(shift, np.float64)
    d = shift.shape[-1]
    problem = None
    if not (np.all(np.isfinite(precision)) and np.all(np.isfinite(shift))):
        problem = "is not finite (NaN or inf)"
    elif precision.ndim == shift.ndim:
        if np.any(precision <= 0):
            problem = "has a precision that is not positive"
        else:
            mean = shift / precision
    elif not np.allclose(precision, np.swapaxes(precision, -1, -2), rtol=1e-5, atol=0):
        problem = "has a precision that is not symmetric"
    else:
        values = np.linalg.eigvalsh(precision)
        scale = np.abs(values).max(axis=-1, keepdims=True)
        if np.any(values <= -d * np.finfo(np.float32).eps * scale) or np.any(scale == 0):
            problem = f"has a precision that is not positive definite (smallest eigenvalue {values.min():.3g})"
        else:
            mean = np.linalg.solve(precision, shift[..., None])[..., 0]
    if problem is None and not np.all(np.isfinite(mean)):
        problem = "has a mean that is not finite"
    if problem is not None:
        what, remedy = describe(fit)
        raise ValueError(f"shard {shard}'s Gaussian surrogate {problem}: its local fit ({what}) failed; {remedy} "
                         "(the sampler's step_size is not the cause)")


def surrogate_bits(dim: int, covariance: str) -> int:
    """Bits of one surrogate on the wire, 32 per float: the shift, and the precision's
    ``d (d + 1) / 2`` distinct entries (full) or its ``d`` diagonal entries."""
    entries = dim * (dim + 1) // 2 if covariance == "full" else dim
    return 32 * (dim + entries)


def local_log_density(model: Model, client_data: ClientData, share) -> Callable:
    """``theta -> share * log p(theta) + sum_{x in shard} log p(x | theta)``, over the shard's mask of
    all rows (a one-off setup: under ``vmap`` each shard reads every row)."""
    valid = gradients.row_weights(client_data.rows, client_data.index)

    def log_density(theta):
        ll = jax.vmap(model.log_likelihood, in_axes=(None, 0))(theta, client_data.rows.x)
        return jnp.sum(valid * ll) + share * model.log_prior(theta)

    return log_density


def _check_covariance(covariance: str) -> str:
    if covariance not in COVARIANCES:
        raise ValueError(f"unknown surrogate covariance {covariance!r}; choose one of {COVARIANCES}")
    return covariance


def _expansion(log_density, theta, covariance: str, min_precision: float) -> GaussianSurrogate:
    """The Gaussian whose log-density matches ``log_density``'s gradient and Hessian at ``theta``,
    with the precision's eigenvalues (or diagonal) floored at ``min_precision`` so it is proper."""
    grad = jax.grad(log_density)(theta)
    precision = -jax.hessian(log_density)(theta)
    if covariance == "diag":
        precision = jnp.maximum(jnp.diag(precision), min_precision)
    else:
        values, vectors = jnp.linalg.eigh(0.5 * (precision + precision.T))
        precision = symmetric((vectors * jnp.maximum(values, min_precision)) @ vectors.T)
    return GaussianSurrogate(precision, grad + matvec(precision, theta))


def taylor(covariance: str = "full", min_precision: float = 1e-6):
    """The analytic surrogate: second-order expansion of the local log-density at ``theta0``.

    Exact (up to rounding) whenever the log-likelihood and log-prior are quadratic in
    ``theta``: ``q_s = N(x_bar_s, I / N_s)`` for the Gaussian mean with unit noise and a flat
    prior, as in El Mekkaoui et al.'s Section 5.1."""
    covariance = _check_covariance(covariance)

    def fit(key, model, client_data, theta0, share):
        del key
        return _expansion(local_log_density(model, client_data, share), theta0, covariance, min_precision)

    return _named(fit, f'surrogate = "taylor", {covariance} covariance',
                  'fit it at the mode (a run that has the mode does: step_size = "auto" or whitened), or use '
                  'surrogate = "laplace"; check that shard\'s data for extreme values')


def laplace(covariance: str = "full", num_steps: int = 50, damping: float = 1e-3, min_precision: float = 1e-6,
            max_halvings: int = 40):
    """Laplace surrogate: the expansion at the local mode, found by ``num_steps`` damped Newton
    steps from ``theta0``.

    A step is ``theta <- theta + t V (max(|l|, damping) + damping)^{-1} V' grad``, with
    ``V diag(l) V'`` the negative Hessian (its eigenvalues by absolute value, so that the step
    ascends where the local log-density is not concave, as it is far from the mode of a model
    with a noise scale) and ``t`` the first of ``1, 1/2, ..., 2^-max_halvings`` that does not
    lower the log-density by more than float32 rounding (``1e-6 (1 + |log q|)``; no step if none
    does). Flooring the eigenvalues at ``damping`` without the absolute value divides by
    ``2 damping`` along a direction of negative curvature: from ``theta0 = 0`` on a regression
    with an unknown noise scale and residuals in the tens, a first step of hundreds, then NaN.
    """
    covariance = _check_covariance(covariance)

    def fit(key, model, client_data, theta0, share):
        del key
        log_density = local_log_density(model, client_data, share)

        def newton(_, theta):
            g = jax.grad(log_density)(theta)
            h = -jax.hessian(log_density)(theta)
            values, vectors = jnp.linalg.eigh(0.5 * (h + h.T))
            step = vectors @ ((vectors.T @ g) / (jnp.maximum(jnp.abs(values), damping) + damping))
            now = log_density(theta)
            floor = now - 1e-6 * (1 + jnp.abs(now))  # what counts as not lower, in float32

            def halve(carry):
                t, _ = carry
                return t / 2, log_density(theta + t / 2 * step)

            def lower(carry):  # a NaN is lower too
                t, new = carry
                return ~(new >= floor) & (t > 2.0 ** -max_halvings)

            t, new = jax.lax.while_loop(lower, halve, (jnp.ones((), theta.dtype), log_density(theta + step)))
            return jnp.where(new >= floor, theta + t * step, theta)

        mode = jax.lax.fori_loop(0, num_steps, newton, theta0)
        return _expansion(log_density, mode, covariance, min_precision)

    return _named(fit, f'surrogate = "laplace", {covariance} covariance, {num_steps} Newton steps',
                  'use surrogate = "taylor" (at the mode), or check that shard\'s data (a separable shard of a '
                  'logistic regression has no local mode: keep the prior share, likelihood_only = false)')


def sgld_moments(step_size: float, num_steps: int, burn_in: int, covariance: str = "diag",
                 batch_size: int | None = None, min_variance: float = 1e-12):
    """Surrogate from the moments of local Langevin samples (El Mekkaoui et al., Section 4).

    From ``theta0``, ``burn_in + num_steps`` steps of

        theta <- theta + (h / 2) v(theta) + sqrt(h) Z,   v = share grad log p + sum_{x in shard} grad log p(x | theta)

    (``v`` on a minibatch, rescaled, if ``batch_size`` is set). The kept iterates' mean ``m``
    and covariance ``C`` (full, or the variances) give ``q_s = N(m, C)``: precision ``C^{-1}``,
    shift ``C^{-1} m``. The covariance is inverted here, once, so what travels is a precision.
    """
    covariance = _check_covariance(covariance)
    if not step_size > 0:
        raise ValueError(f"surrogate SGLD step_size must be > 0 (got {step_size!r})")
    if int(num_steps) < 2 or int(burn_in) < 0:
        raise ValueError(f"surrogate SGLD needs num_steps >= 2 and burn_in >= 0 (got {num_steps}, {burn_in})")
    h = np.float32(step_size)

    def fit(key, model, client_data, theta0, share):
        oracle = gradients.minibatch_gradient(model, batch_size)

        def step(j, carry):
            theta, total, outer = carry
            key_j = jax.random.fold_in(key, j)
            key_grad, key_noise = jax.random.split(key_j)
            drift = share * jax.grad(model.log_prior)(theta) - oracle(key_grad, theta, client_data)
            theta = theta + 0.5 * h * drift + jnp.sqrt(h) * jax.random.normal(key_noise, theta.shape, theta.dtype)
            keep = (j >= burn_in).astype(theta.dtype)
            centred = theta - theta0  # moments about theta0, for float32 accuracy
            second = centred * centred if covariance == "diag" else jnp.outer(centred, centred)
            return theta, total + keep * centred, outer + keep * second

        d = theta0.shape[0]
        zeros2 = jnp.zeros((d,) if covariance == "diag" else (d, d), theta0.dtype)
        _, total, outer = jax.lax.fori_loop(0, burn_in + num_steps, step, (theta0, jnp.zeros_like(theta0), zeros2))
        n = np.float32(num_steps)
        mean_c = total / n
        if covariance == "diag":
            cov = jnp.maximum((outer - n * mean_c**2) / (n - 1), min_variance)
            precision = 1.0 / cov
        else:
            cov = (outer - n * jnp.outer(mean_c, mean_c)) / (n - 1)
            values, vectors = jnp.linalg.eigh(0.5 * (cov + cov.T))
            precision = symmetric((vectors / jnp.maximum(values, min_variance)) @ vectors.T)
        mean = theta0 + mean_c
        return GaussianSurrogate(precision, matvec(precision, mean))

    return _named(fit, f'surrogate = "sgld", {covariance} covariance, surrogate_step_size = {float(step_size):.3g}, '
                       f'surrogate_steps = {int(num_steps)}, surrogate_burn_in = {int(burn_in)}',
                  'its local Langevin chain diverged or kept too few draws: give a smaller surrogate_step_size '
                  '(or "auto" with step_size = "auto") or more surrogate_steps, or use surrogate = "taylor"')
