"""The stochastic leapfrog integrator of Hamiltonian dynamics (Liang et al., 2024, Algorithm 1).

From ``(theta, p)`` with step ``eta`` and a stochastic gradient ``g`` of the potential,

    theta' = theta + eta p - (eta^2 / 2) g(theta, xi_k),
    p'     = p - (eta / 2) g(theta, xi_k) - (eta / 2) g(theta', xi_{k+1/2}),

written as kick ``(eta / 2)``, drift ``eta``, kick ``(eta / 2)``. Every half-kick draws its own
gradient: the closing half-kick of a step uses ``xi_{k+1/2}`` and the next step's opening
half-kick a fresh ``xi_{k+1}`` at the same point, so the momentum receives two independent
gradient noises of weight ``eta / 2`` per interior point. Only what is deterministic is reused
(:class:`fedmcmc.estimators.stochastic.StochasticGradient`): an exact gradient costs one
evaluation a step, a minibatch gradient two.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fedmcmc.estimators.stochastic import StochasticGradient, as_stochastic_gradient


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
