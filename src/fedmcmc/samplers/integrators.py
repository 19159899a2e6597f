"""Integrators: one step of a discretised diffusion, written once for every sampler.

Each Langevin function moves a ``position`` given the gradient ``grad`` of the potential ``U``
(the negative log-density; the caller decides what ``grad`` estimates: the posterior, a
client's share, an augmented target) and draws its own Gaussian noise from ``key``. The
stochastic leapfrog of Hamiltonian dynamics (Liang et al., 2024, Algorithm 1) takes a
:class:`~fedmcmc.estimators.stochastic.StochasticGradient` instead, since it draws a gradient
at every half-kick. They are pure and work on flat float32 vectors, under ``vmap`` and inside
``lax`` loops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedmcmc.core.types import Array, PRNGKey, Schedule, resolve_schedule
from fedmcmc.estimators.stochastic import StochasticGradient, as_stochastic_gradient


def step_size_at(step_size: Schedule, k) -> Array:
    """The step size of iteration ``k`` of a schedule (or a constant), as float32."""
    return jnp.asarray(resolve_schedule(step_size, k), jnp.float32)


def langevin_step(key: PRNGKey, position: Array, grad: Array, step_size) -> Array:
    """One unadjusted Langevin (Euler-Maruyama) step,

        theta' = theta - gamma grad U(theta) + sqrt(2 gamma) Z,     Z ~ N(0, I).

    Parameters
    ----------
    key
        Key of the noise ``Z`` (one standard normal draw of ``position``'s shape and dtype).
    position
        ``theta``.
    grad
        ``grad U(theta)``, or an unbiased estimate of it.
    step_size
        ``gamma > 0``.

    Returns
    -------
    Array
        ``theta'``.
    """
    noise = jax.random.normal(key, position.shape, position.dtype)
    return position - step_size * grad + jnp.sqrt(2.0 * step_size) * noise


def preconditioned_langevin_step(key: PRNGKey, position: Array, grad: Array, step_size,
                                 preconditioner: Array) -> Array:
    """One Langevin step with a diagonal preconditioner ``G`` (Li et al., AAAI 2016, without the
    correction term ``Gamma(theta)``),

        theta' = theta - gamma G grad U(theta) + sqrt(2 gamma G) Z,     Z ~ N(0, I),

    products taken coordinatewise; with ``G = 1`` it is :func:`langevin_step`.

    Parameters
    ----------
    key
        Key of the noise ``Z``.
    position
        ``theta``.
    grad
        ``grad U(theta)``, or an unbiased estimate of it.
    step_size
        ``gamma > 0`` (pSGLD's ``eps / 2``).
    preconditioner
        The diagonal of ``G`` (positive; one entry per coordinate, or a scalar).

    Returns
    -------
    Array
        ``theta'``.
    """
    noise = jax.random.normal(key, position.shape, position.dtype)
    return position - step_size * preconditioner * grad + jnp.sqrt(2.0 * step_size * preconditioner) * noise


def leapfrog_step(grad: StochasticGradient, key, theta, momentum, evaluation, step_size):
    """One stochastic leapfrog step with two independent gradient draws:

        p_half = p - (eta / 2) g(theta, xi_k),    theta' = theta + eta p_half,
        p'     = p_half - (eta / 2) g(theta', xi_{k+1/2}),

    the opening draw from ``fold_in(key, 0)`` and the closing one from ``fold_in(key, 1)``.
    ``evaluation`` is the one at ``theta`` (reused only by a deterministic ``grad``). Returns
    ``(theta', p', m')`` with ``m'`` the evaluation at ``theta'``.
    """
    g, _ = grad.sample(jax.random.fold_in(key, 0), theta, evaluation)
    p = momentum - 0.5 * step_size * g
    theta = theta + step_size * p
    g, evaluation = grad.sample(jax.random.fold_in(key, 1), theta)
    return theta, p - 0.5 * step_size * g, evaluation


def leapfrog(grad, key, theta, momentum, evaluation, step_size, num_steps: int):
    """``num_steps`` stochastic leapfrog steps (:func:`leapfrog_step`) of size ``step_size``.

    ``grad`` is a :class:`~fedmcmc.estimators.stochastic.StochasticGradient` or a function
    ``grad(key, theta)`` (then drawn anew at every half-kick); step ``i`` draws from
    ``fold_in(key, i)``. ``evaluation`` is the gradient evaluation at ``theta`` (used only by a
    deterministic gradient, so a trajectory of exact gradients costs ``num_steps``
    evaluations), or None. Returns ``(theta, momentum, evaluation)`` with ``evaluation`` the
    one at the final ``theta``.
    """
    grad = as_stochastic_gradient(grad)
    if evaluation is None:
        evaluation = grad.evaluate(key, theta) if grad.deterministic else jnp.zeros_like(theta)

    def step(i, carry):
        return leapfrog_step(grad, jax.random.fold_in(key, i), *carry, step_size)

    return jax.lax.fori_loop(0, num_steps, step, (theta, momentum, evaluation))
