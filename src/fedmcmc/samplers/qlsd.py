"""QLSD: Quantised Langevin Stochastic Dynamics (Vono et al., AISTATS 2022, Algorithm 1).

Each round ``k`` the server broadcasts ``theta_k``; every active client ``i in A_k`` computes
a stochastic gradient ``H_i(theta_k)`` of its potential on its own data and uploads its
compression ``C_i(H_i(theta_k))``; the server moves

    theta_{k+1} = theta_k - gamma_k [ grad U_0(theta_k) + c + sum_{i in A_k} w_i C_i(H_i(theta_k)) ]
                  + sqrt(2 gamma_k) Z_{k+1},

with ``w_i = b / |A_k|`` (Algorithm 1) or ``1 / p_i`` (eq. S3), ``U_0 = -log prior`` and a
server constant ``c`` (zero, except ``c = sum_i grad U_i(theta*)`` for control variates).

Variants, all this function with a different oracle and compressor:

* QLSD#: minibatch gradients ``(N_i / n_i) sum_{j in S_i} grad U_ij`` (:func:`qlsd_sharp`);
* QLSD*: control variates at the mode theta* (:func:`qlsd_star`); LSD* is QLSD* uncompressed.
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
from fedmcmc.compression.fixed_point import check_uniform, weighted_sum
from fedmcmc.samplers.integrators import langevin_step, step_size_at
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits


class QLSDState(NamedTuple):
    """Server state: the current sample."""

    position: Any


class QLSDClientState(NamedTuple):
    """Client state: its gradient estimator's state and its compressor's state (e.g. its number
    of levels, or its memory term)."""

    estimator: Any
    compressor: Any


def client_half(estimator: gradients.GradientEstimator, compressor):
    """QLSD's clients: ``(client_init, client_step)`` of a client that uploads
    ``C_i(H_i(theta_k))`` with ``H_i`` from ``estimator`` and ``C_i`` the compressor.

    The round key is split into ``(key_grad, key_comp)``, for the estimator and the compressor.
    """

    def client_init(key, broadcast, client_data):
        del key
        return QLSDClientState(estimator.init(broadcast, client_data),
                               compressor.init(broadcast.position, client_data.index))

    def client_step(key, client_state, broadcast, client_data, k):
        key_grad, key_comp = jax.random.split(key)
        grad, estimator_state = estimator.estimate(key_grad, client_state.estimator, broadcast, client_data, k)
        message, comp_state, cinfo = compressor.apply(key_comp, grad, client_state.compressor)
        return QLSDClientState(estimator_state, comp_state), message, ClientInfo(bits=cinfo.bits)

    return client_init, client_step


def server_move(key, model: Model, participation: Participation, theta, drift, mask, gamma):
    """The server's Langevin move ``theta - gamma [grad U_0(theta) + drift] + sqrt(2 gamma) Z``,
    with ``U_0 = -log prior`` counted once, here; ``theta`` itself in a round with no active
    client if the scheme pauses then (:func:`fedmcmc.samplers.participation.hold_if_empty`)."""
    position = langevin_step(key, theta, drift - jax.grad(model.log_prior)(theta), gamma)
    return participation_lib.hold_if_empty(participation, mask, position, theta)


def qlsd(model: Model, step_size, oracle, compressor=None, participation: Participation | None = None,
         server_constant=None, name: str = "qlsd", num_clients: int | None = None) -> FederatedSampler:
    """Build QLSD with any stochastic-gradient oracle.

    Parameters
    ----------
    model
        The model; its prior is applied once, on the server.
    step_size
        gamma > 0, or a schedule ``k -> gamma_k``.
    oracle
        ``oracle(key, theta, client_data) -> H_i(theta)`` (see :mod:`fedmcmc.estimators.gradients`).
    compressor
        Unbiased compressor applied by each client to its upload (identity if None).
    participation
        Participation scheme (full if None).
    server_constant
        Vector ``c`` added to the aggregated gradient by the server.
    num_clients
        The number of clients that per-client settings inside ``oracle`` are for, if any.
    """
    step_size = checks.step_size(step_size)
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    client_init, client_step = client_half(gradients.stateless(oracle), compressor)

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return QLSDState(theta0), Broadcast(theta0)

    def server_step(key, server_state, uploads, mask, k):
        gamma = step_size_at(step_size, k)
        drift = weighted_sum(compressor, participation.weights(mask), uploads)
        if server_constant is not None:
            drift = drift + server_constant
        position = server_move(key, model, participation, server_state.position, drift, mask, gamma)
        info = ServerInfo(step_size=gamma, broadcast_bits=float_bits(position))
        return QLSDState(position), Broadcast(position), info

    clients = per_client_count(compressor.omega(model.dim), known=(num_clients, participation.num_clients))
    if compressor.aggregate is not None:
        check_uniform(compressor, "the participation weight", participation.weights(jnp.ones((clients or 1,), bool)))
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients)


def qlsd_sharp(model: Model, step_size, batch_size=None, compressor=None, participation=None,
               name: str = "qlsd#") -> FederatedSampler:
    """QLSD# : QLSD with minibatches of ``n_i`` points drawn without replacement by each client."""
    return qlsd(model, step_size, gradients.minibatch_gradient(model, batch_size), compressor,
                participation, name=name, num_clients=per_client_count(batch_size))


def qlsd_star(model: Model, step_size, mode: gradients.ModeResult, batch_size=None, compressor=None,
              participation=None, name: str = "qlsd*") -> FederatedSampler:
    """QLSD* : QLSD with control variates at the mode theta* (from :func:`fedmcmc.estimators.gradients.find_mode`).

    Clients compress ``(N_i / n_i) sum_{j in S_i} [grad U_ij(theta) - grad U_ij(theta*)]``,
    which vanishes at theta*, so the compression noise shrinks near the mode; the server
    adds ``sum_i grad U_i(theta*)`` (a constant it holds) to keep the drift exact.
    """
    oracle = gradients.control_variate_gradient(model, mode.theta, batch_size)
    return qlsd(model, step_size, oracle, compressor, participation,
                server_constant=jnp.asarray(mode.client_grad_sum, jnp.float32), name=name,
                num_clients=per_client_count(batch_size))


def lsd_star(model: Model, step_size, mode: gradients.ModeResult, batch_size=None, participation=None,
             name: str = "lsd*") -> FederatedSampler:
    """LSD* : QLSD* without compression."""
    return qlsd_star(model, step_size, mode, batch_size, identity(), participation, name=name)
