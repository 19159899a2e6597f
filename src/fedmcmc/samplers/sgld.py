"""SGLD (Welling and Teh, ICML 2011): the centralised baseline.

All data sit in one place (run it on ``data.pooled()``, one "client"); each iteration

    theta_{k+1} = theta_k - gamma_k [ grad U_0(theta_k) + (N / n) sum_{j in S_k} grad U_j(theta_k) ]
                  + sqrt(2 gamma_k) Z_{k+1},

with ``S_k`` a minibatch of ``n`` of the ``N`` points drawn without replacement (full
gradient, i.e. ULA, when ``batch_size`` is None). Nothing is communicated: bits are zero.
It shares the federated contract so the same runtime, outputs and tests apply.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model
from fedmcmc.samplers.integrators import langevin_step, step_size_at
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo


class SGLDState(NamedTuple):
    position: Any


def sgld(model: Model, step_size, batch_size=None, name: str = "sgld") -> FederatedSampler:
    """Build centralised SGLD; run it on one client holding all the data."""
    step_size = checks.step_size(step_size)
    oracle = gradients.minibatch_gradient(model, batch_size)

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return SGLDState(theta0), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key, broadcast, client_data
        return ()

    def client_step(key, client_state, broadcast, client_data, k):
        del k
        key_grad, _ = jax.random.split(key)
        grad = oracle(key_grad, broadcast.position, client_data)
        return client_state, grad, ClientInfo(bits=jnp.zeros((), jnp.int32))

    def server_step(key, server_state, uploads, mask, k):
        gamma = step_size_at(step_size, k)
        theta = server_state.position
        position = langevin_step(key, theta, jnp.sum(uploads, axis=0) - jax.grad(model.log_prior)(theta), gamma)
        return SGLDState(position), Broadcast(position), ServerInfo(step_size=gamma, broadcast_bits=jnp.zeros((), jnp.int32))

    return FederatedSampler(init, client_init, client_step, server_step, participation_lib.full(), name)
