"""FedAvg (McMahan, Moore, Ramage, Hampson and Aguera y Arcas, AISTATS 2017, Algorithm 1):
federated averaging of local SGD, the point-estimate contrast to the samplers.

**This is an optimiser, not a sampler.** Its "samples" are the server's iterates; once they
have converged they all sit at one point (up to minibatch jitter), so every posterior
spread computed from them is an artefact. It is here so that predictive metrics and
communication costs can be put side by side with the Bayesian methods.

Client ``c`` holds ``w_c`` (``sum_c w_c = 1``, usually ``N_c / n``) and minimises the
per-point average of its share of the posterior potential, as in McMahan et al.'s
``F_k = (1 / n_k) sum_i f_i``:

    F_c(theta) = [ U_c(theta) + w_c U_0(theta) ] / N_c,

with ``U_c = -sum_j log p(x_cj | theta)`` on its ``N_c`` points and ``U_0 = -log prior``. The
prior share ``w_c U_0`` mirrors :mod:`fedmcmc.samplers.fa_hmc`: with ``w_c = N_c / n``,
``sum_c w_c F_c = U / n`` with ``U = U_0 + sum_c U_c`` the full posterior potential, the prior
counted once, so the fixed point of one local step per round is the MAP estimate.

Each round the server broadcasts ``theta``; every active client starts from it and takes
``T`` (``local_steps``) SGD steps

    theta_c <- theta_c - eta_t g_c(theta_c),     t = k T + s,

with ``g_c`` the minibatch estimate ``(1 / n_c) sum_{j in S} grad U_cj + (w_c / N_c) grad U_0``
(the exact ``grad F_c`` if ``batch_size`` is None), and uploads its change
``Delta_c = theta_c - theta``, compressed by an unbiased ``C_c`` if a compressor is given.
The server moves

    theta <- theta + sum_{c in A} w_c C_c(Delta_c) / sum_{c in A} w_c          ("mcmahan", default)
    theta <- theta + sum_{c in A} a_c w_c C_c(Delta_c)                          ("unbiased")

the first being McMahan et al.'s weighted average of the models of the active clients
(``sum_c w_c theta_c`` under full participation), the second scaling by the participation
weights ``a_c`` (``b / |A|`` or ``1 / p_c``, as FA-HMC does) so that it is unbiased for the
full-participation update. A round with no active client leaves ``theta`` where it is.

With heterogeneous clients and ``T > 1`` the fixed point is *not* the MAP (client drift):
on quadratic ``F_c`` local GD is an affine map per client and the fixed point of the
averaged map is a reweighted combination of the local minimisers.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.compression import identity
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits
from fedmcmc.core.types import resolve_schedule

AGGREGATIONS = ("mcmahan", "unbiased")


class FedAvgState(NamedTuple):
    """Server state: the averaged iterate (the "sample", a point estimate)."""

    position: Any


class FedAvgClientState(NamedTuple):
    """Client state: its compressor's state."""

    compressor: Any


def fedavg(model: Model, weights, learning_rate, local_steps: int = 1, batch_size=None, compressor=None,
           participation: Participation | None = None, aggregation: str = "mcmahan",
           name: str = "fedavg") -> FederatedSampler:
    """Build FedAvg (see the module docstring for the update equations).

    Parameters
    ----------
    model
        The model; client ``c`` carries the share ``w_c`` of its prior.
    weights
        ``w_c``, one per client, positive, summing to 1 (``FederatedData.weights`` gives ``N_c / n``).
    learning_rate
        ``eta > 0`` on the per-point average ``F_c``, or a schedule of the global local step
        ``t = k T + s``.
    local_steps
        ``T >= 1``, SGD steps per round.
    batch_size
        Minibatch size per client (one for all or one per client); full-batch gradients if None.
    compressor
        Unbiased compressor for the uploaded change (identity, 32 bits a float, if None).
    participation
        Who takes part in a round (full if None).
    aggregation
        ``"mcmahan"`` (weighted average over the active clients) or ``"unbiased"``
        (participation weights, see the module docstring).
    """
    learning_rate = checks.step_size(learning_rate)
    w_np = checks.client_weights(weights)
    local_steps = checks.positive_int("local_steps", local_steps)
    checks.choice("aggregation", aggregation, AGGREGATIONS)
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    oracle = gradients.minibatch_gradient(model, batch_size)
    w_all = jnp.asarray(w_np, jnp.float32)

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return FedAvgState(theta0), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key
        return FedAvgClientState(compressor.init(broadcast.position, client_data.index))

    def client_step(key, client_state, broadcast, client_data, k):
        w_c = w_all[client_data.index]
        n_c = client_data.count.astype(jnp.float32)
        key_grad, key_comp = jax.random.split(key)
        theta0 = broadcast.position

        def step(s, theta):
            eta = jnp.asarray(resolve_schedule(learning_rate, k * local_steps + s), jnp.float32)
            g = (oracle(jax.random.fold_in(key_grad, s), theta, client_data)
                 - w_c * jax.grad(model.log_prior)(theta)) / n_c
            return theta - eta * g

        theta = jax.lax.fori_loop(0, local_steps, step, theta0)
        message, comp_state, cinfo = compressor.apply(key_comp, theta - theta0, client_state.compressor)
        return FedAvgClientState(comp_state), message, ClientInfo(bits=cinfo.bits)

    def server_step(key, server_state, uploads, mask, k):
        del key
        m = mask.astype(jnp.float32)
        if aggregation == "mcmahan":
            active_weight = jnp.sum(m * w_all)
            a = m * w_all / jnp.maximum(active_weight, 1e-30)
        else:
            a = participation.weights(mask) * w_all
        position = server_state.position + jnp.tensordot(a, jax.vmap(compressor.decode)(uploads), axes=1)
        position = jnp.where(jnp.any(mask), position, server_state.position)
        eta = jnp.asarray(resolve_schedule(learning_rate, k * local_steps), jnp.float32)
        return (FedAvgState(position), Broadcast(position),
                ServerInfo(step_size=eta, broadcast_bits=float_bits(position)))

    clients = per_client_count(w_np, batch_size, compressor.omega(model.dim), known=(participation.num_clients,))
    if clients is None:
        clients = w_np.size
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients)
