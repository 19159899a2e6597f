"""Each site's chain on its own subposterior: the local half of the one-shot combinations
(consensus Monte Carlo, :mod:`fedmcmc.samplers.consensus_mc`; the Gaussian product of
subposteriors, :mod:`fedmcmc.samplers.gaussian_product`).

The posterior of ``S`` sites factors into their *subposteriors* (Scott et al. 2016, Section 2;
Neiswanger, Wang and Xing 2014, Section 2),

    pi(theta | x) ∝ prod_s p_s(theta),     p_s(theta) ∝ p(x_s | theta) p(theta)^{1 / S},

the prior shared out as a ``1 / S`` power on every site. Site ``s`` samples ``p_s`` alone,
with no communication, by the unadjusted Langevin algorithm (SGLD with minibatches) on the
potential ``U_s(theta) = -log p(x_s | theta) - (1 / S) log p(theta)``,

    theta <- theta - gamma_t [H_s(theta) - (1 / S) grad log p(theta)] + sqrt(2 gamma_t) Z,

``H_s`` the exact gradient of ``-log p(x_s | theta)`` or its minibatch estimate
(:func:`fedmcmc.estimators.gradients.minibatch_gradient`), ``t = k L + j`` the local step count
of step ``j`` of round ``k``. A round runs ``L`` (``local_steps``) steps and records ``G``
(``num_draws``) of them, every ``L / G``-th; the first round first runs ``B``
(``local_burn_in``) unrecorded steps at ``gamma_0``. The chain's position is kept in the
site's state, so round ``k + 1`` continues where round ``k`` ended.

For a Gaussian subposterior of precision ``Lambda_s`` and exact gradients the chain is an
AR(1) process whose stationary law has the exact mean and, along an eigenvector of
``Lambda_s`` of eigenvalue ``lam``, the variance ``1 / (lam (1 - gamma lam / 2))``: the
discretisation inflates the variance by ``1 / (1 - gamma lam / 2)`` and the step is stable for
``gamma lam < 2``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.core.base import Model
from fedmcmc.estimators import gradients
from fedmcmc.samplers.integrators import langevin_step, step_size_at


class SubposteriorState(NamedTuple):
    """A site's state: ``position``, where its chain on ``p_s`` stands."""

    position: Any


class SubposteriorChain(NamedTuple):
    """A site's chain on its subposterior (module docstring).

    ``init(broadcast) -> SubposteriorState`` starts it at the broadcast position;
    ``run(key, state, client_data, k) -> (state, draws)`` runs round ``k`` and returns the
    ``[G, d]`` recorded draws, in order; ``num_draws`` is ``G``, ``local_steps`` ``L`` and
    ``step_size`` the checked step (a number or a schedule).
    """

    init: Callable[..., SubposteriorState]
    run: Callable[..., tuple]
    num_draws: int
    local_steps: int
    step_size: Any


def subposterior_chain(model: Model, num_clients: int, step_size, local_steps: int, num_draws: int | None = None,
                       local_burn_in: int = 0, batch_size=None) -> SubposteriorChain:
    """The chain of every site on ``p(x_s | theta) p(theta)^{1 / S}`` (module docstring).

    Parameters
    ----------
    model
        The model; its prior enters every site's potential with the power ``1 / S``.
    num_clients
        ``S``, the number of sites.
    step_size
        ``gamma > 0``, or a schedule of the local step count ``t = k L + j``.
    local_steps
        ``L``, local steps a round.
    num_draws
        ``G``, recorded draws a round, every ``L / G``-th step; must divide ``L``. Default ``L``.
    local_burn_in
        ``B >= 0``, unrecorded steps before the first round's ``L``.
    batch_size
        Minibatch size per site (one for all or one per site); exact gradients if None.
    """
    step_size = checks.step_size(step_size)
    num_clients = checks.positive_int("num_clients", num_clients)
    local_steps = checks.positive_int("local_steps", local_steps)
    num_draws = local_steps if num_draws is None else checks.positive_int("num_draws", num_draws)
    if local_steps % num_draws:
        raise ValueError(f"num_draws ({num_draws}) must divide local_steps ({local_steps}): a round records "
                         "every (local_steps / num_draws)-th step")
    burn_in = checks.non_negative("local_burn_in", local_burn_in)
    if int(burn_in) != burn_in:
        raise ValueError(f"local_burn_in must be a whole number of local steps (got {local_burn_in!r})")
    burn_in = int(burn_in)
    every = local_steps // num_draws
    oracle = gradients.minibatch_gradient(model, batch_size)
    prior_share = 1.0 / num_clients

    def grad_potential(key, theta, client_data):
        return oracle(key, theta, client_data) - prior_share * jax.grad(model.log_prior)(theta)

    def init(broadcast):
        return SubposteriorState(jnp.asarray(broadcast.position, jnp.float32))

    def run(key, state, client_data, k):
        key_burn, key_run = jax.random.split(key)

        def burn(theta):
            gamma = step_size_at(step_size, 0)

            def step(j, theta):
                key_grad, key_noise = jax.random.split(jax.random.fold_in(key_burn, j))
                return langevin_step(key_noise, theta, grad_potential(key_grad, theta, client_data), gamma)

            return jax.lax.fori_loop(0, burn_in, step, theta)

        theta = state.position
        if burn_in:
            theta = jax.lax.cond(k == 0, burn, lambda t: t, theta)

        def step(j, carry):
            theta, draws = carry
            gamma = step_size_at(step_size, k * local_steps + j)
            key_grad, key_noise = jax.random.split(jax.random.fold_in(key_run, j))
            theta = langevin_step(key_noise, theta, grad_potential(key_grad, theta, client_data), gamma)
            slot = (j + 1) // every - 1
            draws = jnp.where((j + 1) % every == 0, draws.at[slot].set(theta), draws)
            return theta, draws

        draws0 = jnp.zeros((num_draws,) + theta.shape, theta.dtype)
        theta, draws = jax.lax.fori_loop(0, local_steps, step, (theta, draws0))
        return SubposteriorState(theta), draws

    return SubposteriorChain(init, run, num_draws, local_steps, step_size)


def sample_moments(draws):
    """The sample mean ``[d]`` and covariance ``[d, d]`` (divisor ``G - 1``) of ``draws`` ``[G, d]``."""
    mean = jnp.mean(draws, axis=0)
    centred = draws - mean
    return mean, centred.T @ centred / (draws.shape[0] - 1)


def check_covariance_draws(chain: SubposteriorChain, dim: int, what: str) -> None:
    """Refuse ``G <= d`` for a rule that inverts a site's sample covariance (of rank ``G - 1`` at most)."""
    if chain.num_draws <= dim:
        raise ValueError(f"{what} inverts each site's sample covariance of its num_draws = {chain.num_draws} "
                         f"draws, singular unless num_draws > dim = {dim}: record more draws a round")


def step_rule(setting) -> tuple[float, str]:
    """``step_size = "auto"`` for the sites' chains: ``gamma = 2E / (L (1 + max_s N_s / n_s - 1))``.

    A site's potential ``U_s = -log p(x_s | theta) - (1 / S) log p(theta)`` has a Hessian at most
    the posterior's (the other sites' likelihood Hessians and the rest of the prior's are
    positive semi-definite for a log-concave model), so its stiffest curvature is at most
    ``L``, the posterior's at the mode (``setting.lambda_max``): ULA's variance inflation
    ``1 / (1 - gamma lam / 2)`` of :mod:`fedmcmc.samplers.steps` then stays within its target.
    A minibatch of ``n_s`` of ``N_s`` points adds a gradient covariance of about
    ``(N_s / n_s - 1)`` times the site's Hessian (the SGLD rule's argument, site by site). The
    rule is conservative by up to ``S`` on sites of equal size, whose curvature is ``L / S``.
    """
    from fedmcmc.samplers.steps import E

    counts = np.asarray(setting.counts, np.float64)
    batch = setting.args.get("batch_size")
    batch = counts if batch is None else np.minimum(np.broadcast_to(np.asarray(batch, np.float64), counts.shape),
                                                    counts)
    kappa = float(np.max(counts / batch - 1.0))
    return 2.0 * E / (setting.lambda_max * (1.0 + kappa)), "2E / (L (1 + max_s N_s/n_s - 1)) (ULA on each subposterior)"


def hold_unless_complete(mask, new, old):
    """``new`` (leafwise) if every site took part in the round, else ``old``: a combination needs
    one block of draws from every subposterior, so a round that misses a site (a Flower client
    past its timeout) keeps the previous round's draws, as a chain pauses."""
    complete = jnp.all(mask)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(complete, a, b), new, old)
