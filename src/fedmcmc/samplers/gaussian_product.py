"""The Gaussian product of subposteriors: the parametric combination of embarrassingly
parallel MCMC (Neiswanger, Wang and Xing 2014, "Asymptotically exact, embarrassingly parallel
MCMC", Section 3.1).

Site ``s`` of ``S`` draws ``G`` times from its subposterior ``p(x_s | theta) p(theta)^{1 / S}``
by a local Langevin chain (:mod:`fedmcmc.samplers.subposterior`), fits the Gaussian
``N(mu_s, Sigma_s)`` of their sample mean and covariance, and uploads the fit. The server
multiplies the fits,

    prod_s N(mu_s, Sigma_s) ∝ N(mu, Sigma),    Sigma^{-1} = sum_s Sigma_s^{-1},
                                               mu = Sigma sum_s Sigma_s^{-1} mu_s,

and draws ``G`` independent samples of ``N(mu, Sigma)``. Exact when every subposterior is
Gaussian (the product of the subposteriors is the posterior), up to the local chains' error
and the estimates of ``mu_s`` and ``Sigma_s``; a Laplace-type approximation otherwise. The fit
needs ``G > d`` draws a site.

**Rounds.** One round with a long enough local chain is the paper's one-shot method, one
upload per site: the lower bound on communication. Each further round continues every site's
chain by ``local_steps`` steps and fits the new block of ``G`` draws alone; the round's ``G``
draws of ``N(mu, Sigma)`` are its samples (``draws_per_round = G``, in
``server_state.draws``; ``position`` is the last).

**Communication.** Each site uploads ``mu_s`` and the upper triangle of ``Sigma_s``,
``d + d (d + 1) / 2`` floats of 32 bits, whatever ``G``; the server sends ``theta_0`` to start
the sites' chains, and its latest draw each round, which the sites do not use.

**Participation.** Every site takes part in every round: the product needs every factor, so
the sampler takes no participation scheme (full participation). A round that misses a site
anyway (a Flower client past its timeout) keeps the previous round's draws, as a chain pauses.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import FederatedSampler, Model, per_client_count
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.samplers.integrators import step_size_at
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits
from fedmcmc.samplers.subposterior import (check_covariance_draws, hold_unless_complete, sample_moments,
                                            subposterior_chain)


class GaussianProductState(NamedTuple):
    """Server state: ``draws`` (``[G, d]``, the round's draws of the product) and ``position``, the last."""

    position: Any
    draws: Any


class GaussianFit(NamedTuple):
    """A site's upload: the sample mean ``[d]`` of its round's draws and the upper triangle of
    their sample covariance, row by row (``[d (d + 1) / 2]``)."""

    mean: Any
    covariance: Any


def product(means, covariances):
    """``(mu, Sigma)`` of ``prod_s N(mu_s, Sigma_s)`` for ``means`` ``[S, d]`` and ``covariances``
    ``[S, d, d]`` (module docstring)."""
    precisions = jnp.linalg.inv(covariances)
    covariance = jnp.linalg.inv(jnp.sum(precisions, axis=0))
    covariance = 0.5 * (covariance + covariance.T)
    return covariance @ jnp.einsum("sij,sj->i", precisions, means), covariance


def gaussian_product(model: Model, num_clients: int, step_size, local_steps: int, num_draws: int | None = None,
                     local_burn_in: int = 0, batch_size=None, name: str = "gaussian-product") -> FederatedSampler:
    """Build the Gaussian product of subposteriors (see the module docstring).

    Parameters
    ----------
    model
        The model; each site's subposterior takes its prior to the power ``1 / S``.
    num_clients
        ``S``, the number of sites.
    step_size
        The sites' Langevin step ``gamma > 0``, or a schedule of the local step count.
    local_steps
        ``L``, local steps a round.
    num_draws
        ``G``, draws each site records a round (every ``L / G``-th step) and fits, and draws the
        server makes of the product; must divide ``L`` and exceed ``d``. Default ``L``.
    local_burn_in
        Unrecorded local steps at the start of the first round.
    batch_size
        Minibatch size per site (one for all or one per site); exact local gradients if None.
    """
    chain = subposterior_chain(model, num_clients, step_size, local_steps, num_draws, local_burn_in, batch_size)
    check_covariance_draws(chain, model.dim, "the Gaussian product of subposteriors")
    participation = participation_lib.full()
    g, d = chain.num_draws, int(model.dim)
    rows, cols = (jnp.asarray(i, jnp.int32) for i in np.triu_indices(d))

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return GaussianProductState(theta0, jnp.broadcast_to(theta0, (g,) + theta0.shape)), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key, client_data
        return chain.init(broadcast)

    def client_step(key, client_state, broadcast, client_data, k):
        del broadcast
        client_state, draws = chain.run(key, client_state, client_data, k)
        mean, cov = sample_moments(draws)
        fit = GaussianFit(mean, cov[rows, cols])
        return client_state, fit, ClientInfo(bits=float_bits(fit))

    def unpack(triangle):
        upper = jnp.zeros((d, d), triangle.dtype).at[rows, cols].set(triangle)
        return upper + upper.T - jnp.diag(jnp.diagonal(upper))

    def server_step(key, server_state, uploads, mask, k):
        mean, cov = product(uploads.mean, jax.vmap(unpack)(uploads.covariance))
        scale = jnp.linalg.cholesky(cov)
        draws = mean + jax.random.normal(key, (g, d), mean.dtype) @ scale.T
        new = hold_unless_complete(mask, GaussianProductState(draws[-1], draws), server_state)
        gamma = step_size_at(chain.step_size, k * chain.local_steps)
        return new, Broadcast(new.position), ServerInfo(step_size=gamma, broadcast_bits=float_bits(new.position))

    clients = per_client_count(batch_size, known=(num_clients,))
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients,
                            draws_per_round=g)
