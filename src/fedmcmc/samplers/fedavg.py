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

**SCAFFOLD** (Karimireddy et al., ICML 2020): with ``control_variates=scaffold.scaffold()``
(:mod:`fedmcmc.estimators.scaffold`) every local gradient becomes ``g_c - h_c + h``, with
``h_c = grad F_c`` at the last synchronisation point the client saw and
``h = sum_c w_c h_c`` (the gradient of ``sum_c w_c F_c``), which removes the client drift:
the MAP is a fixed point for every ``T``. Each client uploads ``h_c`` and the server
broadcasts ``h`` (32 bits a coordinate each way).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.compression import identity
from fedmcmc.core import checks
from fedmcmc.core.base import Compressor, FederatedSampler, Model, Participation, per_client_count
from fedmcmc.core.types import Schedule
from fedmcmc.estimators import gradients, scaffold
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.samplers.integrators import step_size_at
from fedmcmc.samplers.messages import ClientInfo, ServerInfo, float_bits


def mcmahan(participation: Participation, mask, weights):
    """McMahan et al.'s average of the active clients: ``a_c w_c = w_c / sum_{j in A} w_j`` (0 if none)."""
    del participation  # the average does not depend on the scheme
    m = mask.astype(jnp.float32)
    active_weight = jnp.sum(m * weights)
    return m * weights / jnp.maximum(active_weight, 1e-30)


def unbiased(participation: Participation, mask, weights):
    """The participation weights ``a_c`` (``b / |A|`` or ``1 / p_c``) times ``w_c``."""
    return participation.weights(mask) * weights


#: How the server weighs the active clients' changes.
AGGREGATIONS = {"mcmahan": mcmahan, "unbiased": unbiased}


class FedAvgState(NamedTuple):
    """Server state: the averaged iterate (the "sample", a point estimate), and the clients'
    last control variates ``h_c`` (``[b, d]``, with SCAFFOLD only; else ``()``)."""

    position: Any
    anchors: Any = ()


class FedAvgBroadcast(NamedTuple):
    """What the server sends: theta, and ``h = sum_c w_c h_c`` (SCAFFOLD only; else ``()``)."""

    position: Any
    correction: Any = ()


class FedAvgClientState(NamedTuple):
    """Client state: its compressor's state and its last control variate ``h_c`` (or ``()``)."""

    compressor: Any
    anchor: Any = ()


class FedAvgUpload(NamedTuple):
    """A client's upload: the compressor's message of its change and its new ``h_c`` (or ``()``)."""

    delta: Any
    anchor: Any = ()


class _Settings(NamedTuple):
    """What the steps of a built FedAvg use (checked by :func:`fedavg`)."""

    model: Model
    weights: Any                 # w_c, float32 [b]
    learning_rate: Schedule
    local_steps: int
    oracle: Callable
    compressor: Compressor
    participation: Participation
    aggregate: Callable          # one of AGGREGATIONS
    control: scaffold.ControlVariates


def _init(s: _Settings, key, theta0):
    del key
    theta0 = jnp.asarray(theta0, jnp.float32)
    anchors, correction = s.control.init(s.weights.shape[0], theta0)
    return FedAvgState(theta0, anchors), FedAvgBroadcast(theta0, correction)


def _client_init(s: _Settings, key, broadcast, client_data):
    del key
    return FedAvgClientState(s.compressor.init(broadcast.position, client_data.index),
                             s.control.client_init(broadcast.position))


def _client_step(s: _Settings, key, client_state, broadcast, client_data, k):
    w_c = s.weights[client_data.index]
    n_c = client_data.count.astype(jnp.float32)
    key_grad, key_comp = jax.random.split(key)
    theta0 = broadcast.position

    def objective_gradient(gradient, theta):
        """``grad F_c`` from ``gradient``, an estimate of ``grad U_c``."""
        return (gradient - w_c * jax.grad(s.model.log_prior)(theta)) / n_c

    def estimate(key, theta):
        return objective_gradient(s.oracle(key, theta, client_data), theta)

    estimate = s.control.correct(estimate, broadcast.correction, client_state.anchor)

    def step(t, theta):
        eta = step_size_at(s.learning_rate, k * s.local_steps + t)
        return theta - eta * estimate(jax.random.fold_in(key_grad, t), theta)

    theta = jax.lax.fori_loop(0, s.local_steps, step, theta0)
    message, comp_state, cinfo = s.compressor.apply(key_comp, theta - theta0, client_state.compressor)
    anchor = s.control.refresh(
        lambda t: objective_gradient(gradients.local_gradient(s.model, t, client_data), t), theta0)
    return (FedAvgClientState(comp_state, anchor), FedAvgUpload(message, anchor),
            ClientInfo(bits=cinfo.bits + float_bits(anchor)))


def _server_step(s: _Settings, key, server_state, uploads, mask, k):
    del key
    a = s.aggregate(s.participation, mask, s.weights)
    position = server_state.position + jnp.tensordot(a, jax.vmap(s.compressor.decode)(uploads.delta), axes=1)
    position = jnp.where(jnp.any(mask), position, server_state.position)
    anchors, correction = s.control.aggregate(server_state.anchors, uploads.anchor, mask, s.weights)
    eta = step_size_at(s.learning_rate, k * s.local_steps)
    bits = float_bits(position) + float_bits(correction)
    return (FedAvgState(position, anchors), FedAvgBroadcast(position, correction),
            ServerInfo(step_size=eta, broadcast_bits=bits))


def fedavg(model: Model, weights, learning_rate, local_steps: int = 1, batch_size=None, compressor=None,
           participation: Participation | None = None, aggregation: str = "mcmahan",
           name: str = "fedavg", control_variates: scaffold.ControlVariates | None = None) -> FederatedSampler:
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
    control_variates
        ``scaffold.scaffold()`` for SCAFFOLD's correction of the local gradients (module
        docstring); none if None.
    """
    learning_rate = checks.step_size(learning_rate)
    w_np = checks.client_weights(weights)
    local_steps = checks.positive_int("local_steps", local_steps)
    checks.choice("aggregation", aggregation, AGGREGATIONS)
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    control = scaffold.none() if control_variates is None else control_variates
    s = _Settings(model, jnp.asarray(w_np, jnp.float32), learning_rate, local_steps,
                  gradients.minibatch_gradient(model, batch_size), compressor, participation,
                  AGGREGATIONS[aggregation], control)
    clients = per_client_count(w_np, batch_size, compressor.omega(model.dim), known=(participation.num_clients,))
    if clients is None:
        clients = w_np.size
    return FederatedSampler(partial(_init, s), partial(_client_init, s), partial(_client_step, s),
                            partial(_server_step, s), participation, name, clients)
