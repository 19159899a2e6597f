"""FA-HMC: federated averaging of stochastic-gradient Hamiltonian Monte Carlo
(Liang, Zhang, Deng, Lin, Song, 2024, Algorithm 3), with FA-LD (Deng et al., 2021) as K = 1.

Client ``c`` holds ``w_c`` (``sum_c w_c = 1``, usually ``n_c / n``) and the local potential

    f^(c)(theta) = U_c(theta) / w_c + U_0(theta),    so that    f = sum_c w_c f^(c) = U_0 + sum_c U_c,

with ``U_c = -sum_j log p(x_cj | theta)`` on its own data and ``U_0 = -log prior`` (the prior
enters ``f`` once). One round of this module is one communication period of ``T`` local
iterations. The server broadcasts ``theta``; every client starts from it and, ``T`` times,

    p^(c) = sqrt(rho) xi + sqrt(1 - rho) xi^(c) / sqrt(w_c),     xi, xi^(c) ~ N(0, I),
    K leapfrog steps:  p <- p - (eta/2) g(theta);  theta <- theta + eta p;  p <- p - (eta/2) g(theta),

with ``g`` a stochastic gradient of ``f^(c)`` (exact, a minibatch, or exact plus
N(0, sigma^2 I) noise, the paper's SG setting); the momentum is then discarded. ``xi`` is
shared by all clients through a seed the server broadcasts (Section 4.2); ``xi^(c)`` is
private. Averaged over clients the momentum is N(0, I) for every ``rho``. The client uploads
its change ``Delta_c = theta^(c) - theta`` (compressed by an unbiased ``C_c``) and the server
sets

    theta <- theta + sum_{c in A} a_c w_c C_c(Delta_c),

with ``a_c`` the participation weights (1 under full participation, where this is the
paper's ``sum_c w_c theta^(c)``). The sample of a round is the averaged ``theta``.

With ``K = 1`` a local iteration is ``theta <- theta - (eta^2 / 2) g(theta) + eta p``: FA-LD
with learning rate ``eta^2 / 2``, the form :func:`fa_ld` exposes.

**De-biased FA-HMC** (Algorithm B.2, SCAFFOLD-style) replaces ``g`` by

    g(theta) - h_c + sum_j w_j h_j,      h_j = grad f^(j)(theta_s) (exact),

where ``theta_s`` is the synchronisation point at which every ``h_j`` was computed. Each
client computes ``h_c`` at the ``theta`` it receives and uploads it with its change (32 bits
a coordinate); the server broadcasts ``sum_j w_j h_j`` with the next ``theta``, so the
correction of a round uses the gradients of the previous synchronisation, as SCAFFOLD's
control variates do, at no extra round trip. Summed over clients the correction is zero,
so the averaged drift is exactly ``grad f``; what it removes is the client drift caused by
heterogeneous local potentials. In the first round no ``h`` is known and the correction is
zero. Under partial participation the server keeps the last ``h_j`` of every client.

**Beyond the paper.** Compressed uploads keep the server's update unbiased given the local
trajectories (``E C(Delta) = Delta``), but add variance: the chain's stationary law widens.
Partial participation with ``1 / p_c`` weights keeps the averaged update unbiased; with
``rho < 1`` the averaged momentum of a partial round is no longer N(0, I). A round with no
active client is a pause (``b / |A|`` scaling) or a move of zero (``1 / p_c``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc import gradients, participation as participation_lib
from fedmcmc.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.compression import identity
from fedmcmc.samplers.common import ClientInfo, ServerInfo, check_step_size, float_bits
from fedmcmc.types import resolve_schedule

_SEED_BITS = 64  # the shared momentum seed is one PRNG key: two uint32


class FAState(NamedTuple):
    """Server state.

    Attributes
    ----------
    position
        The averaged ``theta`` (the sample).
    anchors
        ``[b, d]``: each client's last anchor gradient ``h_c`` (de-biased only; else ``()``).
    """

    position: Any
    anchors: Any = ()


class FABroadcast(NamedTuple):
    """What the server sends each round.

    Attributes
    ----------
    position
        theta, where every client starts.
    seed
        The PRNG key from which all clients draw the shared momentum ``xi``.
    correction
        ``sum_j w_j h_j`` (de-biased only; else ``()``).
    """

    position: Any
    seed: Any
    correction: Any = ()


class FAClientState(NamedTuple):
    """Client state: its compressor's state and its last anchor gradient ``h_c`` (or ``()``)."""

    compressor: Any
    anchor: Any = ()


class FAUpload(NamedTuple):
    """A client's upload: its (compressed) change, and its new anchor gradient (or ``()``)."""

    delta: Any
    anchor: Any = ()


def leapfrog(grad_fn, key, theta, momentum, grad, step_size, num_steps: int):
    """``num_steps`` leapfrog steps of size ``step_size`` from ``(theta, momentum)``.

    ``grad`` is the gradient at ``theta``; ``grad_fn(key, theta)`` draws a new (stochastic)
    gradient, one per step with the step's own key. Returns ``(theta, momentum, grad)`` with
    ``grad`` the gradient at the final ``theta``, which the next trajectory reuses, so a
    trajectory costs ``num_steps`` gradient evaluations.
    """

    def step(i, carry):
        theta, p, g = carry
        p = p - 0.5 * step_size * g
        theta = theta + step_size * p
        g = grad_fn(jax.random.fold_in(key, i), theta)
        return theta, p - 0.5 * step_size * g, g

    return jax.lax.fori_loop(0, num_steps, step, (theta, momentum, grad))


def resolve_weights(weights) -> np.ndarray:
    """Validate client weights ``w_c``: positive, finite, summing to 1."""
    w = np.atleast_1d(np.asarray(weights, dtype=np.float64))
    if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"client weights must be positive numbers, one per client (got {weights!r}); "
                         "use FederatedData.weights for n_c / n")
    if abs(w.sum() - 1.0) > 1e-6:
        raise ValueError(f"client weights must sum to 1 (they sum to {w.sum():.6g}); use n_c / n")
    return w


def fa_hmc(model: Model, weights, step_size, num_leapfrog: int, local_steps: int, correlation: float = 0.0,
           batch_size=None, gradient_noise: float = 0.0, debiased: bool = False, compressor=None,
           participation: Participation | None = None, name: str = "fa-hmc") -> FederatedSampler:
    """Build FA-HMC (see the module docstring for the update equations).

    Parameters
    ----------
    model
        The model; its prior is part of every client's local potential ``f^(c)``.
    weights
        ``w_c``, one per client, positive, summing to 1 (``FederatedData.weights`` gives ``n_c / n``).
    step_size
        Leapfrog step ``eta > 0``, or a schedule of the global iteration ``t = k T + s``.
    num_leapfrog
        ``K``, leapfrog steps per local iteration (the momentum is redrawn after each ``K``).
    local_steps
        ``T``, local iterations per communication round.
    correlation
        ``rho`` in [0, 1], the share of the momentum's variance drawn from the common seed.
    batch_size
        Minibatch size per client (one for all or one per client); the exact gradient if None.
    gradient_noise
        ``sigma``: standard deviation of the N(0, sigma^2) noise added to every coordinate of
        every gradient (the paper's simulated stochastic gradients); 0 for none.
    debiased
        Use the de-biased gradient of Algorithm B.2.
    compressor
        Unbiased compressor for the uploaded change (identity if None).
    participation
        Who takes part in a synchronisation (full if None).
    """
    step_size = check_step_size(step_size)
    w_np = resolve_weights(weights)
    for label, value in (("num_leapfrog", num_leapfrog), ("local_steps", local_steps)):
        if int(value) != value or value < 1:
            raise ValueError(f"{label} must be a positive integer (got {value!r})")
    num_leapfrog, local_steps = int(num_leapfrog), int(local_steps)
    if not 0.0 <= float(correlation) <= 1.0:
        raise ValueError(f"correlation rho must lie in [0, 1] (got {correlation!r})")
    if not (np.isfinite(gradient_noise) and gradient_noise >= 0):
        raise ValueError(f"gradient_noise must be a standard deviation >= 0 (got {gradient_noise!r})")
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    oracle = gradients.minibatch_gradient(model, batch_size)
    w_all = jnp.asarray(w_np, jnp.float32)
    rho = float(correlation)
    sqrt_rho, sqrt_1m_rho = np.float32(np.sqrt(rho)), np.float32(np.sqrt(1.0 - rho))

    def local_grad(key, theta, client_data, w_c):
        """A stochastic gradient of f^(c)."""
        key_batch, key_noise = jax.random.split(key)
        g = oracle(key_batch, theta, client_data) / w_c - jax.grad(model.log_prior)(theta)
        if gradient_noise > 0:
            g = g + np.float32(gradient_noise) * jax.random.normal(key_noise, theta.shape, theta.dtype)
        return g

    def exact_local_grad(theta, client_data, w_c):
        return gradients.local_gradient(model, theta, client_data) / w_c - jax.grad(model.log_prior)(theta)

    def init(key, theta0):
        theta0 = jnp.asarray(theta0, jnp.float32)
        anchors = jnp.zeros((w_np.size,) + theta0.shape, jnp.float32) if debiased else ()
        correction = jnp.zeros_like(theta0) if debiased else ()
        return FAState(theta0, anchors), FABroadcast(theta0, key, correction)

    def client_init(key, broadcast, client_data):
        del key
        anchor = jnp.zeros_like(broadcast.position) if debiased else ()
        return FAClientState(compressor.init(broadcast.position, client_data.index), anchor)

    def client_step(key, client_state, broadcast, client_data, k):
        w_c = w_all[client_data.index]
        theta0 = broadcast.position
        key_grad, key_comp = jax.random.split(key)
        if debiased:
            shift = broadcast.correction - client_state.anchor
            grad_fn = lambda kk, th: local_grad(kk, th, client_data, w_c) + shift  # noqa: E731
        else:
            grad_fn = lambda kk, th: local_grad(kk, th, client_data, w_c)  # noqa: E731

        def iteration(s, carry):
            theta, g = carry
            t = k * local_steps + s
            eta = jnp.asarray(resolve_schedule(step_size, t), jnp.float32)
            xi = jax.random.normal(jax.random.fold_in(broadcast.seed, s), theta.shape, theta.dtype)
            key_s = jax.random.fold_in(key_grad, s)
            xi_c = jax.random.normal(jax.random.fold_in(key_s, 0), theta.shape, theta.dtype)
            p = sqrt_rho * xi + (sqrt_1m_rho / jnp.sqrt(w_c)) * xi_c
            theta, _, g = leapfrog(grad_fn, jax.random.fold_in(key_s, 1), theta, p, g, eta, num_leapfrog)
            return theta, g

        g0 = grad_fn(jax.random.fold_in(key_grad, local_steps), theta0)
        theta, _ = jax.lax.fori_loop(0, local_steps, iteration, (theta0, g0))
        delta, comp_state, cinfo = compressor.apply(key_comp, theta - theta0, client_state.compressor)
        bits = cinfo.bits
        anchor = ()
        if debiased:
            anchor = exact_local_grad(theta0, client_data, w_c)
            bits = bits + float_bits(anchor)
        return FAClientState(comp_state, anchor), FAUpload(delta, anchor), ClientInfo(bits=bits)

    def server_step(key, server_state, uploads, mask, k):
        a = participation.weights(mask) * w_all
        position = server_state.position + jnp.tensordot(a, uploads.delta, axes=1)
        anchors, correction = (), ()
        if debiased:
            anchors = jnp.where(mask[:, None], uploads.anchor, server_state.anchors)
            correction = jnp.tensordot(w_all, anchors, axes=1)
        new = participation_lib.hold_if_empty(participation, mask, FAState(position, anchors), server_state)
        eta = jnp.asarray(resolve_schedule(step_size, k * local_steps), jnp.float32)
        broadcast = FABroadcast(new.position, key, correction)
        bits = float_bits(new.position) + _SEED_BITS + (float_bits(correction) if debiased else 0)
        return new, broadcast, ServerInfo(step_size=eta, broadcast_bits=jnp.asarray(bits, jnp.int32))

    clients = per_client_count(w_np, batch_size, compressor.omega(model.dim),
                               known=(participation.num_clients,))
    if clients is None:
        clients = w_np.size
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients)


def fa_ld(model: Model, weights, step_size, local_steps: int, correlation: float = 0.0, batch_size=None,
          gradient_noise: float = 0.0, debiased: bool = False, compressor=None,
          participation: Participation | None = None, name: str = "fa-ld") -> FederatedSampler:
    """FA-LD (Deng et al., 2021): FA-HMC with one leapfrog step per local iteration,

        theta^(c) <- theta^(c) - (eta^2 / 2) g(theta^(c)) + eta p^(c),

    i.e. Langevin dynamics with learning rate ``eta^2 / 2`` on ``f^(c)``, averaged every
    ``T`` iterations. Parameters as :func:`fa_hmc`.
    """
    return fa_hmc(model, weights, step_size, 1, local_steps, correlation, batch_size, gradient_noise,
                  debiased, compressor, participation, name)
