"""DG-SGLD: DG-LMC (Plassier, Vono, Durmus and Moulines, ICML 2021, "DG-LMC: a turn-key and
scalable synchronous distributed MCMC algorithm via Langevin Monte Carlo within Gibbs") with
stochastic gradients, the baseline of the same name in QLSD (Vono et al., AISTATS 2022).

**Augmented target.** Client ``i`` keeps an auxiliary copy ``z_i`` of the parameter, tied to
``theta`` by a Gaussian of variance ``rho_i`` (the *tolerance*):

    pi_rho(theta, z_1..z_b) ∝ exp(-U_0(theta)) prod_i exp(-U_i(z_i) - ||z_i - theta||^2 / (2 rho_i)),

with ``U_0 = -log prior`` and ``U_i`` client ``i``'s negative log-likelihood. Its
``theta``-marginal is ``exp(-U_0) prod_i (exp(-U_i) * N(0, rho_i I))``: every local likelihood
is smoothed by a Gaussian of variance ``rho_i``. **It is not the posterior**; it tends to the
posterior as every ``rho_i -> 0`` (for a Gaussian ``U_i`` of precision ``N_i`` the local
variance ``1 / N_i`` becomes ``1 / N_i + rho_i``), while small ``rho_i`` slow the Gibbs
sampler down and force small client steps.

**One round** is one Gibbs sweep. The server broadcasts ``theta``; every active client runs
``T_i`` (``num_local_steps``) Langevin steps on ``z -> U_i(z) + ||z - theta||^2 / (2 rho_i)``,

    z_i <- z_i - gamma_i [ H_i(z_i) + (z_i - theta) / rho_i ] + sqrt(2 gamma_i) Z,

with ``H_i`` an unbiased minibatch estimate of ``grad U_i`` (the exact gradient if
``batch_size`` is None, which is DG-LMC), keeps ``z_i`` and uploads it (32 bits a coordinate).
The server then draws ``theta`` given all the ``z_i`` (the last upload of every client):

* exactly, when the prior is Gaussian or flat (the default): with prior precision ``P`` and
  ``grad log prior(theta) = c - P theta``,

      theta ~ N(Q^{-1} (c + sum_i z_i / rho_i), Q^{-1}),     Q = P + (sum_i 1 / rho_i) I;

  the prior is recognised as quadratic when the model is built (its gradient is checked to be
  affine at random points) and ``Q^{-1}`` and its square root are computed once;
* or, for any prior, with one Langevin step of size ``h`` (``prior_step_size``) on
  ``theta -> U_0(theta) + sum_i ||z_i - theta||^2 / (2 rho_i)``.

Clients start with ``z_i = theta_0``. The sample of a round is the new ``theta``.

**Partial participation.** Inactive clients keep ``z_i`` and the server uses their last
upload: a random-scan Gibbs sweep, which leaves the same augmented target invariant (up to
the Langevin discretisation), so upload weights play no role. A round with no active client
keeps ``theta`` when the scheme pauses on empty rounds, and redraws it from the same
conditional otherwise.

Bias, in short: the ``theta``-marginal is off by the tolerance ``rho`` (above) and by the
discretisation of the client steps (``gamma_i``) and of the server step (``h``, if used);
minibatches add noise on top, as in SGLD. The client steps are stable only for
``gamma_i (L_i + 1 / rho_i) < 2``, ``L_i`` the Lipschitz constant of ``grad U_i``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.samplers.integrators import langevin_step
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits

_MAX_FULL_HESSIAN_DIM = 2048


class DGState(NamedTuple):
    """Server state: ``position`` (theta, the sample) and ``z`` (``[b, d]``, the last auxiliary
    variable uploaded by each client)."""

    position: Any
    z: Any


class DGClientState(NamedTuple):
    """Client state: its auxiliary variable ``z_i``."""

    z: Any


class QuadraticPrior(NamedTuple):
    """``grad log prior(theta) = shift - P theta`` with ``P = diag(precision)`` (``precision``
    of shape ``[d]``) or ``P = precision`` (``[d, d]``)."""

    precision: np.ndarray
    shift: np.ndarray


def quadratic_prior(model: Model, seed: int = 0) -> QuadraticPrior | None:
    """``model.log_prior`` as a quadratic (Gaussian or flat prior), or None if it is not one.

    The gradient ``g(theta) = grad log prior(theta)`` of a quadratic is affine, ``c - P theta``:
    ``c = g(0)``; a diagonal ``P`` is read off one random point and checked at two others; a
    full ``P`` (the Hessian at 0, for ``d <= 2048``) is checked at the same points.
    """
    d = int(model.dim)
    grad = jax.jit(jax.grad(model.log_prior))
    rng = np.random.default_rng(seed)
    c = np.asarray(grad(jnp.zeros(d, jnp.float32)), np.float64)
    probe = rng.choice([-1.0, 1.0], d) * rng.uniform(0.5, 2.0, d)
    tests = [rng.normal(0.0, 3.0, d) for _ in range(2)]

    def affine_at(t, apply_p):
        got = np.asarray(grad(jnp.asarray(t, jnp.float32)), np.float64)
        want = c - apply_p(t)
        scale = np.abs(c) + np.abs(apply_p(t)) + 1e-6
        return np.all(np.isfinite(got)) and np.all(np.abs(got - want) <= 1e-4 * scale + 1e-6)

    g_probe = np.asarray(grad(jnp.asarray(probe, jnp.float32)), np.float64)
    diag = (c - g_probe) / probe
    diag = np.where(np.abs(diag) < 1e-7 * (np.abs(c) + 1.0), 0.0, diag)
    if np.all(np.isfinite(diag)) and np.all(diag >= 0) and all(affine_at(t, lambda x: diag * x) for t in tests):
        return QuadraticPrior(diag, c)
    if d > _MAX_FULL_HESSIAN_DIM:
        return None
    full = -np.asarray(jax.hessian(model.log_prior)(jnp.zeros(d, jnp.float32)), np.float64)
    full = 0.5 * (full + full.T)
    if not np.all(np.isfinite(full)) or np.linalg.eigvalsh(full).min() < -1e-6 * (np.abs(full).max() + 1.0):
        return None
    if all(affine_at(t, lambda x: full @ x) for t in tests):
        return QuadraticPrior(full, c)
    return None


def exact_theta(model: Model, total_inv_rho: float):
    """The server's exact draw of ``theta`` given ``z`` (Gaussian or flat prior ``N(shift / P, P^-1)``
    in natural form): ``theta ~ N(Sigma (shift + sum_i z_i / rho_i), Sigma)`` with
    ``Sigma = (P + sum_i 1 / rho_i I)^-1``. Returns ``draw(theta, pull, noise)``."""
    prior = quadratic_prior(model)
    if prior is None:
        raise ValueError(f"the prior of model {model.name!r} is not Gaussian or flat, so theta cannot be "
                         "drawn exactly given z: give prior_step_size for a Langevin step on theta")
    if prior.precision.ndim == 1:
        cond_cov = 1.0 / (prior.precision + total_inv_rho)
        cond_scale = np.sqrt(cond_cov)
    else:
        cond_cov = np.linalg.inv(prior.precision + total_inv_rho * np.eye(model.dim))
        cond_cov = 0.5 * (cond_cov + cond_cov.T)
        cond_scale = np.linalg.cholesky(cond_cov)
    cov, scale = jnp.asarray(cond_cov, jnp.float32), jnp.asarray(cond_scale, jnp.float32)
    shift = jnp.asarray(prior.shift, jnp.float32)
    if prior.precision.ndim == 1:
        return lambda theta, pull, noise: cov * (shift + pull) + scale * noise
    return lambda theta, pull, noise: cov @ (shift + pull) + scale @ noise


def langevin_theta(model: Model, total_inv_rho: float, prior_step_size: float):
    """One Langevin step of size ``h`` on ``theta`` given ``z`` (any prior):
    ``theta' = theta - h (sum_i (theta - z_i) / rho_i - grad log pi_0(theta)) + sqrt(2 h) xi``.
    Returns ``draw(theta, pull, noise)``. The noise scale is computed in float64, as since the
    first version (:func:`~fedmcmc.samplers.integrators.langevin_step`'s float32 square root
    differs in the last bit for some ``h``)."""
    h = checks.positive("prior_step_size", prior_step_size)
    if h * total_inv_rho >= 2.0:
        raise ValueError(f"prior_step_size h = {h:g} is unstable: h * sum_i 1 / rho_i = {h * total_inv_rho:g} "
                         "must be < 2 (and well below 1 for accuracy)")
    noise_scale = np.float32(np.sqrt(2.0 * h))

    def draw(theta, pull, noise):
        drift = total_inv_rho * theta - pull - jax.grad(model.log_prior)(theta)
        return theta - h * drift + noise_scale * noise

    return draw


def dg_sgld(model: Model, rho, step_size, num_local_steps=1, batch_size=None, num_clients: int | None = None,
            participation: Participation | None = None, prior_step_size: float | None = None,
            name: str = "dg-sgld") -> FederatedSampler:
    """Build DG-SGLD (DG-LMC when ``batch_size`` is None); see the module docstring.

    Parameters
    ----------
    model
        The model; its prior enters the server's draw of ``theta``.
    rho
        Tolerance ``rho_i > 0``, one for all clients or one per client.
    step_size
        Client step ``gamma_i > 0``, one for all clients or one per client.
    num_local_steps
        ``T_i >= 1``, Langevin steps on ``z_i`` per round, one for all or one per client.
    batch_size
        Minibatch size per client (one for all or one per client); exact gradients if None.
    num_clients
        The number of clients; needed only if no other setting is given per client.
    participation
        Who updates ``z_i`` in a round (full if None).
    prior_step_size
        ``h > 0``: draw ``theta`` with one Langevin step of size ``h`` instead of exactly;
        required when the prior is not Gaussian or flat.
    """
    rho_np = checks.per_client("rho (the tolerance)", rho)
    gamma_np = checks.per_client("step_size (the client step gamma)", step_size)
    steps_np = checks.per_client_int("num_local_steps", num_local_steps)
    if num_clients is not None:
        checks.positive_int("num_clients", num_clients)
    participation = participation_lib.full() if participation is None else participation
    b = per_client_count(rho_np, gamma_np, steps_np, batch_size, known=(num_clients, participation.num_clients))
    if b is None:
        raise ValueError("DG-SGLD needs the number of clients (the server keeps every client's z_i): "
                         "give num_clients, or rho / step_size / num_local_steps per client")
    oracle = gradients.minibatch_gradient(model, batch_size)
    inv_rho_np = 1.0 / np.broadcast_to(rho_np, (b,))
    total_inv_rho = float(inv_rho_np.sum())

    draw_theta = (exact_theta(model, total_inv_rho) if prior_step_size is None
                  else langevin_theta(model, total_inv_rho, prior_step_size))
    inv_rho = jnp.asarray(inv_rho_np, jnp.float32)
    gamma_all = jnp.asarray(np.broadcast_to(gamma_np, (b,)), jnp.float32)
    steps_all = jnp.asarray(np.broadcast_to(steps_np, (b,)), jnp.int32)
    max_steps = int(steps_np.max())

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return DGState(theta0, jnp.broadcast_to(theta0, (b,) + theta0.shape)), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        del key, client_data
        return DGClientState(broadcast.position)

    def client_step(key, client_state, broadcast, client_data, k):
        del k
        i = client_data.index
        gamma, r, num_steps = gamma_all[i], inv_rho[i], steps_all[i]
        theta = broadcast.position

        def step(s, z):
            key_grad, key_noise = jax.random.split(jax.random.fold_in(key, s))
            new = langevin_step(key_noise, z, oracle(key_grad, z, client_data) + r * (z - theta), gamma)
            return jnp.where(s < num_steps, new, z)

        z = jax.lax.fori_loop(0, max_steps, step, client_state.z)
        return DGClientState(z), z, ClientInfo(bits=float_bits(z))

    def server_step(key, server_state, uploads, mask, k):
        del k
        z_all = jnp.where(mask[:, None], uploads, server_state.z)
        pull = jnp.tensordot(inv_rho, z_all, axes=1)  # sum_i z_i / rho_i
        theta = server_state.position
        position = draw_theta(theta, pull, jax.random.normal(key, theta.shape, theta.dtype))
        new = participation_lib.hold_if_empty(participation, mask, DGState(position, z_all), server_state)
        step = jnp.asarray(0.0 if prior_step_size is None else prior_step_size, jnp.float32)
        return new, Broadcast(new.position), ServerInfo(step_size=step, broadcast_bits=float_bits(new.position))

    return FederatedSampler(init, client_init, client_step, server_step, participation, name, b)
