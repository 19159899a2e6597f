"""Integrators: one step of a discretised diffusion, written once for every sampler.

Each function moves a ``position`` given the gradient ``grad`` of the potential ``U`` (the
negative log-density; the caller decides what ``grad`` estimates: the posterior, a client's
share, an augmented target) and draws its own Gaussian noise from ``key``. They are pure and
work on flat float32 vectors, under ``vmap`` and inside ``lax`` loops.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedmcmc.core.types import Array, PRNGKey, Schedule, resolve_schedule


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
