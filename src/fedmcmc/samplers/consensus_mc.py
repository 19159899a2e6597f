"""Consensus Monte Carlo (Scott, Blocker, Bonassi, Chipman, George and McCulloch 2016, "Bayes and
big data: the consensus Monte Carlo algorithm", Section 2): each site samples its own
subposterior, uploads its draws once, and the server averages them across sites, weighted by
precision.

Site ``s`` of ``S`` draws ``theta_s^(1..G)`` from ``p(x_s | theta) p(theta)^{1 / S}`` by a
local Langevin chain (:mod:`fedmcmc.samplers.subposterior`) and uploads them. The server forms
the ``G`` consensus draws

    theta^(g) = (sum_s W_s)^{-1} sum_s W_s theta_s^(g),      g = 1..G,

with ``W_s`` the inverse of the sample covariance of site ``s``'s ``G`` draws, Scott et al.'s
choice (``weighting = "covariance"``, which needs ``G > d``), or the inverse of its diagonal
(``weighting = "diagonal"``, their cheaper variant for many parameters: coordinatewise
precision weights). If every subposterior is Gaussian, the weighted average of independent
draws is a draw of the product of the subposteriors, which is the posterior: the combination is
exact for Gaussian models, up to the local chains' error and the estimate of ``W_s``; otherwise
it is biased (the paper's point).

**Rounds.** One round with a long enough local chain (``local_burn_in`` plus ``local_steps``)
is the paper's one-shot method: the round's ``G`` consensus draws are the samples
(``draws_per_round = G``, kept in ``server_state.draws``; ``position`` is the last). Each
further round continues every site's chain by ``local_steps`` steps and combines the new
block of ``G`` draws alone, with weights from that block.

**Communication.** Each site uploads its round's draws, ``G d`` floats of 32 bits; the server
sends ``theta_0`` to start the sites' chains, and its latest consensus draw each round, which
the sites do not use.

**Participation.** Every site takes part in every round: a consensus draw averages one draw of
every subposterior, so the sampler takes no participation scheme (full participation). A round
that misses a site anyway (a Flower client past its timeout) keeps the previous round's draws,
as a chain pauses.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core import checks
from fedmcmc.core.base import FederatedSampler, Model, per_client_count
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.samplers.integrators import step_size_at
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits
from fedmcmc.samplers.subposterior import (check_covariance_draws, hold_unless_complete, sample_moments,
                                            subposterior_chain)

WEIGHTINGS = ("covariance", "diagonal")


class ConsensusState(NamedTuple):
    """Server state: ``draws`` (``[G, d]``, the round's consensus draws) and ``position``, the last."""

    position: Any
    draws: Any


class DrawsUpload(NamedTuple):
    """A site's upload: its round's ``[G, d]`` draws of its subposterior."""

    draws: Any


def precision_weights(draws, weighting: str):
    """``W_s`` of one site's ``[G, d]`` draws: the inverse sample covariance ``[d, d]``
    (``"covariance"``) or the inverse sample variances ``[d]`` (``"diagonal"``)."""
    _, cov = sample_moments(draws)
    if weighting == "diagonal":
        return 1.0 / jnp.diagonal(cov)
    return jnp.linalg.inv(cov)


def consensus(draws, weighting: str = "covariance"):
    """The consensus draws ``[G, d]`` of the sites' draws ``[S, G, d]`` (module docstring)."""
    w = jax.vmap(lambda d: precision_weights(d, weighting))(draws)  # [S, d, d] or [S, d]
    if weighting == "diagonal":
        return jnp.sum(w[:, None, :] * draws, axis=0) / jnp.sum(w, axis=0)
    pulled = jnp.einsum("sij,sgj->gi", w, draws)  # sum_s W_s theta_s^(g)
    return jnp.linalg.solve(jnp.sum(w, axis=0), pulled.T).T


def consensus_mc(model: Model, num_clients: int, step_size, local_steps: int, num_draws: int | None = None,
                 local_burn_in: int = 0, weighting: str = "covariance", batch_size=None,
                 name: str = "consensus-mc") -> FederatedSampler:
    """Build consensus Monte Carlo (see the module docstring).

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
        ``G``, draws each site records and uploads a round (every ``L / G``-th step); must
        divide ``L``, and exceed ``d`` with ``weighting = "covariance"``. Default ``L``.
    local_burn_in
        Unrecorded local steps at the start of the first round.
    weighting
        ``"covariance"`` (``W_s`` the inverse sample covariance) or ``"diagonal"`` (the
        inverse sample variances).
    batch_size
        Minibatch size per site (one for all or one per site); exact local gradients if None.
    """
    checks.choice("weighting", weighting, WEIGHTINGS)
    chain = subposterior_chain(model, num_clients, step_size, local_steps, num_draws, local_burn_in, batch_size)
    if weighting == "covariance":
        check_covariance_draws(chain, model.dim, 'consensus Monte Carlo with weighting = "covariance"')
    elif chain.num_draws < 2:
        raise ValueError("consensus Monte Carlo weighs each site by the sample variances of its draws: "
                         "num_draws must be at least 2")
    participation = participation_lib.full()
    g = chain.num_draws

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return ConsensusState(theta0, jnp.broadcast_to(theta0, (g,) + theta0.shape)), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key, client_data
        return chain.init(broadcast)

    def client_step(key, client_state, broadcast, client_data, k):
        del broadcast
        client_state, draws = chain.run(key, client_state, client_data, k)
        return client_state, DrawsUpload(draws), ClientInfo(bits=float_bits(draws))

    def server_step(key, server_state, uploads, mask, k):
        del key
        draws = consensus(uploads.draws, weighting)
        new = hold_unless_complete(mask, ConsensusState(draws[-1], draws), server_state)
        gamma = step_size_at(chain.step_size, k * chain.local_steps)
        return new, Broadcast(new.position), ServerInfo(step_size=gamma, broadcast_bits=float_bits(new.position))

    clients = per_client_count(batch_size, known=(num_clients,))
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients,
                            draws_per_round=g)

