"""DSGLD (Ahn, Shahbaba and Welling, ICML 2014) and CG-DSGLD, also called FSGLD
(El Mekkaoui, Mesquita, Blomstedt and Kaski, UAI 2021): a chain that travels between shards.

A chain sits on one shard at a time. Each round the server hands it to shard ``s`` with
probability ``f_s`` (``sum_s f_s = 1``); the shard runs ``L`` local Langevin steps on its own
data and hands the chain back,

    theta <- theta + (h / 2) [ v_s(theta) + alpha g_s(theta) ] + sqrt(h) Z,    Z ~ N(0, I),

    v_s(theta) = grad log p(theta) + N_s / (f_s m) sum_{x in B} grad log p(x | theta),

with ``B`` a minibatch of ``m`` of the shard's ``N_s`` points (all of them if ``m`` is None): a
Langevin step of size ``h / 2`` on the potential ``-log p`` (:mod:`fedmcmc.samplers.integrators`).
Averaged over the shard choice, ``v_s`` is the full-data gradient, but within a visit the
chain follows shard ``s`` alone: with many local steps it drifts towards
``p(theta) p(x_s | theta)^{1 / f_s}``, the pathology El Mekkaoui et al. cure with the
*conducive gradient* (their eq. 5-7)

    g_s(theta) = grad log q(theta) - (1 / f_s) grad log q_s(theta),     q = prod_s q_s,

where ``q_s`` is a surrogate of shard ``s``'s density (:mod:`fedmcmc.estimators.surrogates`), added
by a wrapper of the shard's estimator (:mod:`fedmcmc.estimators.conducive`). ``g_s`` has
mean zero over ``s`` for any surrogates (their Lemma 1), so ``v_s + alpha g_s`` stays unbiased
for every ``alpha > 0``. If ``q_s`` is exact up to a constant, as it is for conjugate Gaussian
models, ``v_s + g_s`` equals the full-data gradient plus minibatch noise: the shard bias
cancels. Surrogates of ``p(theta)^{f_s} p(x_s | theta)`` (what :mod:`fedmcmc.estimators.surrogates` fits)
cancel it too when the prior is Gaussian, since the prior shares add up to the prior.
With ``likelihood_only=True`` the surrogates are fitted to the local likelihood
``p(x_s | theta)`` alone (share 0), as in El Mekkaoui et al.'s Section 5.3 ("densities
proportional to the local likelihoods"); ``q`` is then a surrogate of the full likelihood and
the prior enters ``v_s`` only, exactly.

**Communication.** Each round is one visit: the server sends ``theta`` (32 bits a
coordinate) and the shard returns the visit's draws, the last of which is the new ``theta``.
CG-DSGLD starts with the setup exchange of :class:`fedmcmc.estimators.conducive.Conducive`:
every shard fits ``q_s`` and uploads it once, and receives ``q`` once.

**Draws.** The chain's samples are its local iterates, every ``record_every`` local steps
(El Mekkaoui et al. keep every 100th). With ``record_every < L`` a round yields
``L / record_every`` draws, which travel with the hand-off; with ``record_every = L`` (the
default) a round yields its final ``theta``, and the runtime's thinning counts visits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.estimators.conducive import Conducive, conducive as conducive_gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model, Setup, per_client_count
from fedmcmc.samplers.integrators import langevin_step, step_size_at
from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits


class DSGLDState(NamedTuple):
    """Server state: ``position`` (the chain's parameter after the last visit) and ``draws``
    (``[m, d]``, the last visit's recorded iterates; ``position`` is its last row)."""

    position: Any
    draws: Any


class DSGLDUpload(NamedTuple):
    """A shard's hand-off: the visit's recorded iterates ``[m, d]``."""

    draws: Any


def drift_estimate(key, model: Model, oracle, theta, client_data, f_s):
    """``v_s(theta)`` on shard ``s``, with ``oracle`` a minibatch estimate of
    ``-sum_{x in shard} grad log p(x | theta)``."""
    return jax.grad(model.log_prior)(theta) - oracle(key, theta, client_data) / f_s


def dsgld(model: Model, probs, step_size, local_steps: int, batch_size=None, record_every: int | None = None,
          name: str = "dsgld", conducive: Conducive | None = None) -> FederatedSampler:
    """Build DSGLD, or CG-DSGLD with a ``conducive`` estimator (see the module docstring).

    Parameters
    ----------
    model
        The model; its prior enters every local step.
    probs
        ``f_s``, the probability of visiting each shard (one per shard, summing to 1).
    step_size
        ``h > 0`` in ``theta + (h / 2) v + N(0, h I)``, or a schedule of the local step count
        ``t = k L + j``.
    local_steps
        ``L``, local steps per visit (one round).
    batch_size
        ``m``, minibatch size per shard (one for all or one per shard); full shards if None.
    record_every
        Local steps between recorded draws; must divide ``L``. Default ``L`` (one draw a visit).
    conducive
        Conducive gradients with their setup exchange (CG-DSGLD, :func:`cg_dsgld`); None for DSGLD.
    """
    step_size = checks.step_size(step_size)
    f_np = checks.per_client("shard probabilities f_s", probs, sums_to_one=True,
                             hint="; use FederatedData.weights for N_s / N or np.full(S, 1 / S)")
    local_steps = checks.positive_int("local_steps", local_steps)
    record_every = local_steps if record_every is None else record_every
    if int(record_every) != record_every or record_every < 1 or local_steps % int(record_every):
        raise ValueError(f"record_every ({record_every!r}) must be a positive divisor of local_steps "
                         f"({local_steps}); thin across visits with the runtime's thinning instead")
    record_every = int(record_every)
    num_draws = local_steps // record_every
    participation = participation_lib.categorical(f_np)
    oracle = gradients.minibatch_gradient(model, batch_size)
    f_all = jnp.asarray(f_np, jnp.float32)

    def init(key, theta0):
        del key
        theta0 = jnp.asarray(theta0, jnp.float32)
        return DSGLDState(theta0, jnp.broadcast_to(theta0, (num_draws,) + theta0.shape)), Broadcast(theta0)

    def client_init(key, broadcast, client_data):
        if conducive is None:
            return ()
        return conducive.init(key, model, client_data, broadcast.position, f_all[client_data.index])

    def client_step(key, client_state, broadcast, client_data, k):
        f_s = f_all[client_data.index]

        def drift(key_grad, theta):
            return drift_estimate(key_grad, model, oracle, theta, client_data, f_s)

        if conducive is not None:
            drift = conducive.wrap(drift, client_state)

        def step(j, carry):
            theta, draws = carry
            h = step_size_at(step_size, k * local_steps + j)
            key_grad, key_noise = jax.random.split(jax.random.fold_in(key, j))
            theta = langevin_step(key_noise, theta, -drift(key_grad, theta), 0.5 * h)  # U = -log density
            slot = (j + 1) // record_every - 1
            draws = jnp.where((j + 1) % record_every == 0, draws.at[slot].set(theta), draws)
            return theta, draws

        draws0 = jnp.zeros((num_draws,) + broadcast.position.shape, broadcast.position.dtype)
        _, draws = jax.lax.fori_loop(0, local_steps, step, (broadcast.position, draws0))
        return client_state, DSGLDUpload(draws), ClientInfo(bits=float_bits(draws))

    def server_step(key, server_state, uploads, mask, k):
        del key
        draws = jnp.tensordot(mask.astype(jnp.float32), uploads.draws, axes=1)
        new = DSGLDState(draws[-1], draws)
        h = step_size_at(step_size, k * local_steps)
        return new, Broadcast(new.position), ServerInfo(step_size=h, broadcast_bits=float_bits(new.position))

    setup = None if conducive is None else _setup(conducive, model)
    clients = per_client_count(f_np, batch_size) or f_np.size
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients,
                            setup=setup, draws_per_round=num_draws)


def _setup(conducive: Conducive, model: Model) -> Setup:
    """CG-DSGLD's setup exchange: every shard uploads ``q_s``, every shard receives ``q``."""

    def client(key, client_state, broadcast, client_data):
        state, message, bits = conducive.upload(key, model, client_state, client_data, broadcast.position)
        return state, message, ClientInfo(bits=bits)

    def server(key, server_state, uploads):
        del key
        message, bits = conducive.combine(uploads)
        return server_state, message, ServerInfo(step_size=jnp.zeros((), jnp.float32), broadcast_bits=bits)

    return Setup(client, server, conducive.receive, conducive.check)


def cg_dsgld(model: Model, probs, step_size, local_steps: int, surrogate=None, batch_size=None,
             record_every: int | None = None, alpha: float = 1.0, name: str = "cg-dsgld",
             likelihood_only: bool = False, anchor=None) -> FederatedSampler:
    """CG-DSGLD / FSGLD: DSGLD with conducive gradients (:func:`fedmcmc.estimators.conducive.conducive`)
    from Gaussian shard surrogates ``surrogate`` (``surrogates.taylor()``, exact for conjugate
    Gaussian models, if None), scaled by ``alpha > 0``; ``likelihood_only`` fits each ``q_s`` to
    ``p(x_s | theta)`` (prior share 0) instead of ``p(theta)^{f_s} p(x_s | theta)`` (see the
    module docstring). The shards fit their surrogates at ``anchor`` (the run config gives the
    federated mode when the run has it), else at each chain's start: a Taylor surrogate fitted at
    a start away from the mode can make a shard's local potential concave (a conducive term
    ``L - L_s / f_s`` that repels), which diverges within a visit. Other parameters as :func:`dsgld`."""
    return dsgld(model, probs, step_size, local_steps, batch_size, record_every, name,
                 conducive_gradients(surrogate, alpha, likelihood_only, anchor))
