"""VR-FALD*: federated averaging Langevin dynamics with control variates at the mode
(Plassier, Moulines and Durmus, AISTATS 2023, "Federated averaging Langevin dynamics: toward a
unified theory and new algorithms").

FA-LD (:func:`fedmcmc.samplers.fa_ld`, the paper's FALD) runs ``T`` Langevin steps on each
client's own potential ``f^(c) = U_c / w_c + U_0`` between averagings; on non-IID data the
clients' local modes differ, each is pulled towards its own during a round, and the averaged
chain's stationary law is off the posterior by a bias that grows with the heterogeneity and
with ``T``. VR-FALD* replaces client ``c``'s minibatch gradient by a control variate at the
posterior mode ``theta*``, evaluated on the same minibatch:

    g_c(theta) = (1 / w_c) (N_c / n_c) sum_{j in S_c} [grad U_cj(theta) - grad U_cj(theta*)]
                 + grad U_0(theta) + sum_i grad U_i(theta*),

with ``U_0 = -log prior``, ``U_c = -sum_j log p(x_cj | theta)``, ``w_c`` the client's share
(``sum_c w_c = 1``) and ``S_c`` a minibatch of ``n_c`` of its ``N_c`` points. Its mean is
``grad f^(c)(theta) - grad f^(c)(theta*) + grad f(theta*)``: every client's drift is the same,
``grad f(theta*)`` (zero at an exact mode), at ``theta = theta*``, so no client is pulled
elsewhere, and ``sum_c w_c g_c`` is unbiased for ``grad f = grad U`` at every ``theta``. On
quadratic local potentials ``(lam_c / 2)||theta - mu_c||^2`` client ``c``'s corrected potential
is ``(lam_c / 2)||theta - theta*||^2`` (centred at the mode, with its own curvature), so the
stationary mean is the posterior mean exactly; only the variance keeps the discretisation's
and the local steps' inflation. Near the mode the minibatch noise of ``g_c`` vanishes too (the
"VR", variance reduction, of the name; the star marks the control point ``theta*``).

**A round.** The server broadcasts ``theta_k``; every active client sets ``theta^(c) =
theta_k`` and takes ``T`` (``local_steps``) steps, ``n = k T + t`` globally,

    theta^(c) <- theta^(c) - (eta_n^2 / 2) g_c(theta^(c)) + eta_n p^(c)_n,
    p^(c)_n = sqrt(rho) xi_n + sqrt(1 - rho) xi^(c)_n / sqrt(w_c),     xi_n, xi^(c)_n ~ N(0, I),

``xi_n`` shared by all clients through a seed the server broadcasts (sent only if ``rho > 0``),
``xi^(c)_n`` private; it uploads ``C_c(theta^(c) - theta_k)`` and the server moves

    theta_{k+1} = theta_k + sum_{c in A_k} a_c w_c C_c(theta^(c) - theta_k),

``a_c`` the participation weights (1 under full participation, where this is the paper's
``sum_c w_c theta^(c)``) and ``C_c`` an unbiased compressor (the identity by default). The
sample of a round is ``theta_{k+1}``. The clients hold ``theta*`` and the constant
``sum_i grad U_i(theta*)``, from the federated mode search (:func:`fedmcmc.estimators.gradients.find_mode`);
nothing else is sent. With full batches a client computes its ``grad U_c(theta*)`` once, at its
first round, and keeps it.

**Step size.** ``step_size`` is ``eta``, the leapfrog step of :func:`fedmcmc.samplers.fa_ld` (so
the two samplers' settings mean the same): a local step is a Langevin step of learning rate
``gamma = eta^2 / 2`` with noise ``sqrt(2 gamma)``. The authors' code's local update
``theta - gamma grad U_c + sqrt(2 gamma) (sqrt(tau / b) xi + sqrt(1 - tau) xi^(c))`` with ``b``
equal clients is this one with ``gamma_code = b gamma`` (its ``tau`` is ``rho``, and
``f^(c) = b U_c``). A schedule is a function of the global local step ``n``.

**The paper and the authors' code.** The update above is not checked against the paper's
algorithm box, whose text could not be consulted; it follows the paper's abstract (control
variates that correct the client drift of FALD), the authors' public code
(github.com/VincentPlassier/Federated_Averaging_Langevin_Dynamics, ``vr_fald_star_np.py`` and
``vr_fald_star.py``), and the construction of QLSD* by the same authors (:func:`fedmcmc.samplers.qlsd_star`).
The code's client gradient is ``g_i(theta; S) - g_i(theta_ref; S) + mean_j grad U_j(theta_ref)``,
this module's form with ``theta_ref`` for ``theta*``. Where this module differs from the code:

* the control point is the mode ``theta*``, fixed (assumed from the star, which marks control
  variates at ``theta*`` in QLSD*, and from the paper's abstract). The code starts ``theta_ref`` at its initial point (in its deep-learning
  runs, clients pre-trained by SGD, near the mode) and, each local step with probability ``q``,
  moves it to the current average and recomputes the exact gradients there (an SVRG-style
  refresh, as QLSD++ is to QLSD*); that refresh is not implemented;
* a round is a fixed ``T`` local steps, as :func:`fedmcmc.samplers.fa_ld`'s; the code averages
  after each local step with probability ``p`` (a geometric number of local steps per round;
  whether the paper's algorithm does is not checked);
* compression and partial participation are this package's shared schemes (beyond the paper).

**Randomness.** Client ``c``'s key of round ``k`` splits into ``(key_grad, key_comp)``; local
step ``t`` draws its private noise from ``fold_in(fold_in(key_grad, t), 0)`` and its minibatch
from ``fold_in(fold_in(key_grad, t), 1)``, the shared noise from ``fold_in(seed, t)``.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.compression import identity
from fedmcmc.core import checks
from fedmcmc.core.base import Compressor, FederatedSampler, Model, Participation, per_client_count
from fedmcmc.core.types import Schedule
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.samplers.integrators import step_size_at
from fedmcmc.samplers.messages import ClientInfo, ServerInfo, float_bits

_SEED_BITS = 64  # the shared noise's seed is one PRNG key: two uint32


class VRFALDState(NamedTuple):
    """Server state: the averaged ``theta`` (the sample)."""

    position: Any


class VRFALDBroadcast(NamedTuple):
    """What the server sends each round: ``theta_k``, and the seed of the shared noise
    (``rho > 0`` only; else ``()``)."""

    position: Any
    seed: Any = ()


class VRFALDClientState(NamedTuple):
    """Client state: its compressor's state, and with full batches its exact ``grad U_c(theta*)``
    (computed once; ``()`` with minibatches, whose control variate is taken on each minibatch)."""

    compressor: Any
    anchor: Any = ()


class _Settings(NamedTuple):
    """What the steps of a built VR-FALD* use (checked by :func:`vr_fald_star`)."""

    model: Model
    weights: Any                 # w_c, float32 [b]
    step_size: Schedule
    local_steps: int
    sqrt_rho: Any
    sqrt_1m_rho: Any
    shared: bool                 # rho > 0: a shared noise, whose seed is broadcast
    oracle: Callable             # (N_c / n_c) sum_{j in S_c} [grad U_cj(theta) - grad U_cj(theta*)]
    theta_star: Any
    exact: bool                  # full batches: grad U_c(theta) - grad U_c(theta*), the latter held
    constant: Any                # sum_i grad U_i(theta*)
    compressor: Compressor
    participation: Participation


def _gradient(s: _Settings, key, theta, client_data, w_c, anchor):
    """``g_c(theta)``: the control-variate gradient of ``f^(c)`` (module docstring)."""
    if s.exact:
        difference = gradients.local_gradient(s.model, theta, client_data) - anchor
    else:
        difference = s.oracle(key, theta, client_data)
    return difference / w_c - jax.grad(s.model.log_prior)(theta) + s.constant


def _init(s: _Settings, key, theta0):
    theta0 = jnp.asarray(theta0, jnp.float32)
    return VRFALDState(theta0), VRFALDBroadcast(theta0, key if s.shared else ())


def _client_init(s: _Settings, key, broadcast, client_data):
    del key
    # theta* batched over the chains as the position is: computed per chain, both runtimes give the same
    # bits (a constant theta* is batched differently by the simulator and by the Flower clients)
    at = s.theta_star + 0.0 * broadcast.position
    anchor = gradients.local_gradient(s.model, at, client_data) if s.exact else ()
    return VRFALDClientState(s.compressor.init(broadcast.position, client_data.index), anchor)


def _client_step(s: _Settings, key, client_state, broadcast, client_data, k):
    w_c = s.weights[client_data.index]
    theta0 = broadcast.position
    key_grad, key_comp = jax.random.split(key)

    def step(t, theta):
        key_t = jax.random.fold_in(key_grad, t)
        eta = step_size_at(s.step_size, k * s.local_steps + t)
        noise = (s.sqrt_1m_rho / jnp.sqrt(w_c)) * jax.random.normal(jax.random.fold_in(key_t, 0), theta.shape,
                                                                    theta.dtype)
        if s.shared:
            noise = noise + s.sqrt_rho * jax.random.normal(jax.random.fold_in(broadcast.seed, t), theta.shape,
                                                           theta.dtype)
        g = _gradient(s, jax.random.fold_in(key_t, 1), theta, client_data, w_c, client_state.anchor)
        return theta - (0.5 * eta * eta) * g + eta * noise

    theta = jax.lax.fori_loop(0, s.local_steps, step, theta0)
    message, comp_state, cinfo = s.compressor.apply(key_comp, theta - theta0, client_state.compressor)
    return client_state._replace(compressor=comp_state), message, ClientInfo(bits=cinfo.bits)


def _server_step(s: _Settings, key, server_state, uploads, mask, k):
    a = s.participation.weights(mask) * s.weights
    position = server_state.position + jnp.tensordot(a, jax.vmap(s.compressor.decode)(uploads), axes=1)
    new = participation_lib.hold_if_empty(s.participation, mask, VRFALDState(position), server_state)
    eta = step_size_at(s.step_size, k * s.local_steps)
    broadcast = VRFALDBroadcast(new.position, key if s.shared else ())
    bits = float_bits(new.position) + (_SEED_BITS if s.shared else 0)
    return new, broadcast, ServerInfo(step_size=eta, broadcast_bits=jnp.asarray(bits, jnp.int32))


def vr_fald_star(model: Model, weights, step_size, mode: gradients.ModeResult, local_steps: int,
                 correlation: float = 0.0, batch_size=None, compressor=None,
                 participation: Participation | None = None, name: str = "vr-fald*") -> FederatedSampler:
    """Build VR-FALD* (see the module docstring for the update equations).

    Parameters
    ----------
    model
        The model; its prior is part of every client's local potential ``f^(c)``.
    weights
        ``w_c``, one per client, positive, summing to 1 (``FederatedData.weights`` gives ``n_c / n``).
    step_size
        ``eta > 0`` (a local step's learning rate is ``eta^2 / 2``, as :func:`fedmcmc.samplers.fa_ld`'s),
        or a schedule of the global local step ``n = k T + t``.
    mode
        The control point ``theta*`` and ``sum_i grad U_i(theta*)``
        (:func:`fedmcmc.estimators.gradients.find_mode`).
    local_steps
        ``T``, local Langevin steps per round (one communication).
    correlation
        ``rho`` in [0, 1] (the paper's ``tau``), the share of the noise's variance drawn from the
        seed shared by all clients.
    batch_size
        Minibatch size per client (one for all or one per client); the exact gradient if None.
    compressor
        Unbiased compressor for the uploaded change (identity if None).
    participation
        Who takes part in a round (full if None).
    """
    step_size = checks.step_size(step_size)
    w_np = checks.client_weights(weights)
    local_steps = checks.positive_int("local_steps", local_steps)
    rho = checks.unit_interval("correlation rho", correlation)
    if not isinstance(mode, gradients.ModeResult):
        raise ValueError(f"mode must be the ModeResult of fedmcmc.estimators.gradients.find_mode (got "
                         f"{type(mode).__name__})")
    theta_star = np.asarray(mode.theta, np.float32)
    constant = np.asarray(mode.client_grad_sum, np.float32)
    if theta_star.shape != (model.dim,) or constant.shape != (model.dim,):
        raise ValueError(f"the mode is for dimension {theta_star.shape}, the model's is {model.dim}: find the mode "
                         "of this model")
    if not (np.all(np.isfinite(theta_star)) and np.all(np.isfinite(constant))):
        raise ValueError("the mode is not finite: find_mode failed; check the model and the data")
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    s = _Settings(model=model, weights=jnp.asarray(w_np, jnp.float32), step_size=step_size, local_steps=local_steps,
                  sqrt_rho=np.float32(np.sqrt(rho)), sqrt_1m_rho=np.float32(np.sqrt(1.0 - rho)), shared=rho > 0,
                  oracle=gradients.control_variate_gradient(model, theta_star, batch_size),
                  theta_star=jnp.asarray(theta_star), exact=batch_size is None,
                  constant=jnp.asarray(constant), compressor=compressor, participation=participation)
    clients = per_client_count(w_np, batch_size, compressor.omega(model.dim), known=(participation.num_clients,))
    if clients is None:
        clients = w_np.size
    return FederatedSampler(partial(_init, s), partial(_client_init, s), partial(_client_step, s),
                            partial(_server_step, s), participation, name, clients)
