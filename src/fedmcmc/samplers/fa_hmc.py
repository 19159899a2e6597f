"""FA-HMC: federated averaging of stochastic-gradient Hamiltonian Monte Carlo
(Liang, Zhang, Deng, Lin, Song, 2024), with FA-LD (Deng et al., 2021) as K = 1.

Client ``c`` holds ``w_c`` (``sum_c w_c = 1``, usually ``n_c / n``) and the local potential

    f^(c)(theta) = U_c(theta) / w_c + U_0(theta),    so that    f = sum_c w_c f^(c) = U_0 + sum_c U_c,

with ``U_c = -sum_j log p(x_cj | theta)`` on its own data and ``U_0 = -log prior`` (the prior
enters ``f`` once).

**The stochastic leapfrog step** (Algorithm 1). From ``(theta, p)`` with step ``eta``,

    theta' = theta + eta p - (eta^2 / 2) g(theta, xi_k),
    p'     = p - (eta / 2) g(theta, xi_k) - (eta / 2) g(theta', xi_{k+1/2}),

written as kick ``(eta / 2)``, drift ``eta``, kick ``(eta / 2)``
(:func:`fedmcmc.samplers.integrators.leapfrog_step`). ``g`` is a stochastic gradient of ``f^(c)``: exact, a
minibatch estimate, or exact plus N(0, sigma^2 I) noise (the paper's SG setting,
:func:`fedmcmc.estimators.stochastic.gaussian_noise`). Every half-kick draws its own gradient,
so the momentum receives two independent gradient noises of weight ``eta / 2`` per interior
point (variance ``eta^2 sigma^2 / 2`` per step, not the ``eta^2 sigma^2`` of one reused draw);
only what is deterministic is reused.

**Momentum.** A trajectory is ``K`` leapfrog steps; at its start every client draws

    p^(c) = sqrt(rho) xi + sqrt(1 - rho) xi^(c) / sqrt(w_c),     xi, xi^(c) ~ N(0, I),

with ``xi`` shared by all clients through a seed the server broadcasts (Section 4.2) and
``xi^(c)`` private; averaged over clients the momentum is N(0, I) for every ``rho``.

**Two clocks: what ``T`` (``local_steps``) counts.** Trajectories start at the global leapfrog
steps ``n = 0, K, 2K, ...``; a round is one communication, after which the server sets

    theta <- theta + sum_{c in A} a_c w_c C_c(Delta_c),      Delta_c = theta^(c) - theta,

(``C_c`` an unbiased compressor, ``a_c`` the participation weights, 1 under full participation,
where this is the paper's ``sum_c w_c theta^(c)``), and every client restarts from it. The
sample of a round is the averaged ``theta``.

* ``clock="leapfrog"`` (default): a round is ``T`` leapfrog steps, the global steps
  ``n = k T + t``, ``t = 0..T-1``, of round ``k``. This is the paper as it runs it (Section 5: "We
  conduct the synchronization of the model parameters every T local leapfrog step"), and the
  only reading under which its experiments (K = 104 with T = 10 in Section 5.1, K = 100 with
  T = 1..100 in Fig. 1c) make sense. ``K`` and ``T`` need not divide each other: a trajectory
  may span several synchronisations, or end and restart inside a round. At a
  synchronisation, ``theta^(c)`` jumps to the average and the trajectory goes on with the
  client's momentum: the paper does not say what happens to it, and ``momentum_sync``
  chooses (below).
* ``clock="trajectory"``: a round is ``T`` whole trajectories, ``K T`` leapfrog steps
  (Algorithm 3 as printed, the algorithm the theory analyses: each iteration ``t`` draws
  a momentum and runs ``K`` leapfrog steps, and the parameters are averaged every ``T``
  iterations). It is exactly the leapfrog clock with ``K T`` leapfrog steps per round (same
  draws, same samples), which is how it is implemented.

**Momentum at a synchronisation** (``momentum_sync``; it matters only when ``K`` does not
divide the number of leapfrog steps per round, otherwise every round starts a trajectory and
the momentum is redrawn):

* ``"local"`` (default): each client keeps its own momentum. Nothing more is sent; with
  ``rho < 1`` the clients' private momenta ``xi^(c) / sqrt(w_c)`` keep driving them apart
  until the trajectory ends, as within a round.
* ``"average"``: the momenta are averaged like the positions (each client uploads its
  change of momentum raw, 32 bits a coordinate, and the server broadcasts the average with
  ``theta``). After the first synchronisation of a trajectory every client continues with
  the same averaged momentum, whose law is N(0, I)-like for every ``rho``: the rest of the
  trajectory follows the averaged dynamics, closer to centralised HMC, at the cost of ``d``
  more floats each way per round.

A client that misses rounds (partial participation) keeps its state, momentum included, as
every sampler's inactive clients do.

**Step size.** ``eta`` is a constant or a schedule of the trajectory counter
``j = floor(n / K)`` (constant along a trajectory, as ``eta_t`` in Algorithm 3); on the
trajectory clock ``j = k T + s`` for the ``s``-th trajectory of round ``k``, as before.
``step_decay`` gives the paper's dynamic step (Proposition 4.5): ``eta`` for the first ``t_1``
trajectories, then stages of doubling length with ``eta`` divided by ``sqrt(2)`` at each
(:mod:`fedmcmc.samplers.schedules`).

With ``K = 1`` both clocks coincide and a step is ``theta <- theta - (eta^2 / 2) g(theta) + eta
p``: FA-LD with learning rate ``eta^2 / 2``, the form :func:`fa_ld` exposes.

**De-biased FA-HMC** (Algorithm B.2, SCAFFOLD-style) replaces ``g`` by

    g(theta) - h_c + sum_j w_j h_j,      h_j = grad f^(j)(theta_s) (exact),

where ``theta_s`` is the synchronisation point at which every ``h_j`` was computed: SCAFFOLD's
control variates (:mod:`fedmcmc.estimators.scaffold`). Each client computes ``h_c`` at the
``theta`` it receives and uploads it with its change; the server broadcasts ``sum_j w_j h_j``
with the next ``theta``, so the correction of a round uses the gradients of the previous
synchronisation (``theta_{t-T}`` in Algorithm B.2). On either clock the synchronisations are
the rounds. Summed over clients the correction is zero, so the averaged drift is exactly
``grad f``; what it removes is the client drift caused by heterogeneous local potentials.
It is exact to first order in a round's length only: over a long round each client relaxes
towards the minimiser of its corrected potential, and their average is a Newton step with
``sum_c w_c H_c^{-1}`` in place of ``H^{-1}``, which overshoots where a client's potential is
much flatter than the others'. Past an overshoot of 2 the round's mean map expands and the
chain has no stationary law (:func:`fedmcmc.evaluation.laws.fa_hmc_radius`; on four banks split
by income, 50 leapfrog steps of 0.01 a round give a law tens of times too wide, which the posterior
check of a run flags, docs/design.md). Fewer local steps, a smaller step or no de-biasing keep it stable.

**Beyond the paper.** Compressed uploads keep the server's update unbiased given the local
trajectories (``E C(Delta) = Delta``), but add variance: the chain's stationary law widens.
Partial participation with ``1 / p_c`` weights keeps the averaged update unbiased; with
``rho < 1`` the averaged momentum of a partial round is no longer N(0, I). A round with no
active client is a pause (``b / |A|`` scaling) or a move of zero (``1 / p_c``).

**Randomness.** Within client ``c``'s key of round ``k`` (docs/design.md), split into
``(key_grad, key_comp)``: the private momentum of the ``j``-th trajectory started in the
round is drawn from ``fold_in(fold_in(key_grad, j), 0)`` (the shared one from
``fold_in(seed, j)``), and the two gradient draws of the round's leapfrog step ``t`` from
``fold_in(key_t, 0)`` (opening) and ``fold_in(key_t, 1)`` (closing), ``key_t =
fold_in(fold_in(fold_in(key_grad, 0), 1), t)``.
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
from fedmcmc.core.xla import materialize
from fedmcmc.estimators import gradients, scaffold
from fedmcmc.estimators.stochastic import StochasticGradient, gaussian_noise
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.samplers.integrators import leapfrog_step, step_size_at
from fedmcmc.samplers.schedules import doubling_stages
from fedmcmc.samplers.messages import ClientInfo, ServerInfo, float_bits
from fedmcmc.samplers.trajectories import run_round, round_trajectories, steps_per_round

_SEED_BITS = 64  # the shared momentum seed is one PRNG key: two uint32
#: What happens to the clients' momenta at a synchronisation inside a trajectory.
MOMENTUM_SYNCS = ("local", "average")


class FAState(NamedTuple):
    """Server state.

    Attributes
    ----------
    position
        The averaged ``theta`` (the sample).
    anchors
        ``[b, d]``: each client's last anchor gradient ``h_c`` (de-biased only; else ``()``).
    momentum
        The averaged momentum (``momentum_sync="average"`` with trajectories across
        synchronisations only; else ``()``).
    """

    position: Any
    anchors: Any = ()
    momentum: Any = ()


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
    momentum
        The averaged momentum every client continues with (``momentum_sync="average"``
        with trajectories across synchronisations only; else ``()``).
    """

    position: Any
    seed: Any
    correction: Any = ()
    momentum: Any = ()


class FAClientState(NamedTuple):
    """Client state: its compressor's state, its last anchor gradient ``h_c`` (or ``()``), and its
    momentum (``momentum_sync="local"`` with trajectories across synchronisations only; else ``()``)."""

    compressor: Any
    anchor: Any = ()
    momentum: Any = ()


class FAUpload(NamedTuple):
    """A client's upload: the compressor's message of its change, its new anchor gradient (or ``()``), and its
    change of momentum (``momentum_sync="average"`` with trajectories across synchronisations
    only; else ``()``)."""

    delta: Any
    anchor: Any = ()
    momentum: Any = ()


class _Settings(NamedTuple):
    """What the steps of a built FA-HMC use (checked by :func:`fa_hmc`)."""

    model: Model
    weights: Any                 # w_c, float32 [b]
    step_size: Schedule
    num_leapfrog: int
    steps: int                   # leapfrog steps per round
    sqrt_rho: Any
    sqrt_1m_rho: Any
    oracle: Callable
    exact: bool                  # exact gradients (no minibatches)
    gradient_noise: float
    control: scaffold.ControlVariates
    compressor: Compressor
    participation: Participation
    keep_momentum: bool          # a client's momentum crosses synchronisations
    average_momentum: bool       # the momenta are averaged at synchronisations


def _potential_gradient(s: _Settings, gradient, theta, w_c):
    """``grad f^(c) = grad U_c / w_c - grad log prior`` from ``gradient``, an estimate of ``grad U_c``."""
    return gradient / w_c - jax.grad(s.model.log_prior)(theta)


def _client_gradient(s: _Settings, client_data, w_c, correction, anchor) -> StochasticGradient:
    """The stochastic gradient of f^(c), with the control-variate correction and the gradient noise."""

    def evaluate(key, theta):
        return _potential_gradient(s, s.oracle(key, theta, client_data), theta, w_c)

    evaluate = s.control.correct(evaluate, correction, anchor)
    return gaussian_noise(StochasticGradient(evaluate, deterministic=s.exact), s.gradient_noise)


def _draw_momentum(s: _Settings, seed, key_grad, j, w_c, like):
    """The momentum of the round's j-th trajectory: shared xi from the seed, private xi^(c)."""
    shared, private = materialize(jnp.stack([jax.random.fold_in(seed, j),
                                             jax.random.fold_in(jax.random.fold_in(key_grad, j), 0)]))
    xi = jax.random.normal(shared, like.shape, like.dtype)
    xi_c = jax.random.normal(private, like.shape, like.dtype)
    return s.sqrt_rho * xi + (s.sqrt_1m_rho / jnp.sqrt(w_c)) * xi_c


def _eta_at(s: _Settings, counter):
    return step_size_at(s.step_size, counter)


def _init(s: _Settings, key, theta0):
    theta0 = jnp.asarray(theta0, jnp.float32)
    anchors, correction = s.control.init(s.weights.shape[0], theta0)
    momentum = jnp.zeros_like(theta0) if s.average_momentum else ()  # round 0 starts a trajectory
    return FAState(theta0, anchors, momentum), FABroadcast(theta0, key, correction, momentum)


def _client_init(s: _Settings, key, broadcast, client_data):
    anchor = s.control.client_init(broadcast.position)
    momentum = ()
    if s.keep_momentum:  # redrawn at step 0; a client absent from round 0 starts with this draw
        w_c = s.weights[client_data.index]
        momentum = _draw_momentum(s, broadcast.seed, key, 0, w_c, broadcast.position)
    return FAClientState(s.compressor.init(broadcast.position, client_data.index), anchor, momentum)


def _client_step(s: _Settings, key, client_state, broadcast, client_data, k):
    w_c = s.weights[client_data.index]
    theta0 = broadcast.position
    key_grad, key_comp = jax.random.split(key)
    key_steps = jax.random.fold_in(jax.random.fold_in(key_grad, 0), 1)
    grad = _client_gradient(s, client_data, w_c, broadcast.correction, client_state.anchor)
    # the evaluation at theta0, reused by the first half-kick if the gradient is exact
    m0 = grad.evaluate(key_grad, theta0) if grad.deterministic else jnp.zeros_like(theta0)
    if s.keep_momentum:
        p0 = client_state.momentum
    elif s.average_momentum:
        p0 = broadcast.momentum
    else:
        p0 = jnp.zeros_like(theta0)  # never used: the round starts a trajectory

    def step(t, carry, eta):
        return leapfrog_step(grad, jax.random.fold_in(key_steps, t), *carry, eta)

    def draw(j, theta):
        return _draw_momentum(s, broadcast.seed, key_grad, j, w_c, theta)

    theta, p, _ = run_round(step, draw, partial(_eta_at, s), k, s.steps, s.num_leapfrog, (theta0, p0, m0))
    message, comp_state, cinfo = s.compressor.apply(key_comp, theta - theta0, client_state.compressor)

    def exact(theta):
        return _potential_gradient(s, gradients.local_gradient(s.model, theta, client_data), theta, w_c)

    anchor = s.control.refresh(exact, theta0)
    momentum_up = p - p0 if s.average_momentum else ()
    state = FAClientState(comp_state, anchor, p if s.keep_momentum else ())
    bits = cinfo.bits + float_bits(anchor) + float_bits(momentum_up)
    return state, FAUpload(message, anchor, momentum_up), ClientInfo(bits=bits)


def _server_step(s: _Settings, key, server_state, uploads, mask, k):
    a = s.participation.weights(mask) * s.weights
    position = server_state.position + jnp.tensordot(a, jax.vmap(s.compressor.decode)(uploads.delta), axes=1)
    anchors, correction = s.control.aggregate(server_state.anchors, uploads.anchor, mask, s.weights)
    momentum = ()
    if s.average_momentum:
        momentum = server_state.momentum + jnp.tensordot(a, uploads.momentum, axes=1)
    new = participation_lib.hold_if_empty(s.participation, mask, FAState(position, anchors, momentum),
                                          server_state)
    eta = _eta_at(s, round_trajectories(k, s.steps, s.num_leapfrog)[2])
    broadcast = FABroadcast(new.position, key, correction, new.momentum)
    bits = float_bits(new.position) + _SEED_BITS + float_bits(correction) + float_bits(new.momentum)
    return new, broadcast, ServerInfo(step_size=eta, broadcast_bits=jnp.asarray(bits, jnp.int32))


def fa_hmc(model: Model, weights, step_size, num_leapfrog: int, local_steps: int, correlation: float = 0.0,
           batch_size=None, gradient_noise: float = 0.0, debiased: bool = False, compressor=None,
           participation: Participation | None = None, name: str = "fa-hmc", *, clock: str = "leapfrog",
           momentum_sync: str = "local", step_decay: int | None = None) -> FederatedSampler:
    """Build FA-HMC (see the module docstring for the update equations).

    Parameters
    ----------
    model
        The model; its prior is part of every client's local potential ``f^(c)``.
    weights
        ``w_c``, one per client, positive, summing to 1 (``FederatedData.weights`` gives ``n_c / n``).
    step_size
        Leapfrog step ``eta > 0``, or a schedule of the trajectory counter ``j = floor(n / K)``,
        ``n`` the global leapfrog step.
    num_leapfrog
        ``K``, leapfrog steps per trajectory (the momentum is redrawn every ``K`` leapfrog steps).
    local_steps
        ``T``, what a round (one communication) lasts, counted on ``clock``.
    correlation
        ``rho`` in [0, 1], the share of the momentum's variance drawn from the common seed.
    batch_size
        Minibatch size per client (one for all or one per client); the exact gradient if None.
    gradient_noise
        ``sigma``: standard deviation of the N(0, sigma^2) noise added to every coordinate of
        every gradient draw (the paper's simulated stochastic gradients); 0 for none.
    debiased
        Use the de-biased gradient of Algorithm B.2.
    compressor
        Unbiased compressor for the uploaded change (identity if None).
    participation
        Who takes part in a synchronisation (full if None).
    clock
        What ``T`` counts. ``"leapfrog"`` (default): positions are averaged every ``T`` leapfrog
        steps, and a trajectory of ``K`` steps may span synchronisations; this is how the paper
        runs FA-HMC in all its experiments (Section 5), hence the default. ``"trajectory"``:
        every ``T`` trajectories of ``K`` steps (Algorithm 3 as printed), the same as
        ``clock="leapfrog"`` with ``K T`` steps per round.
    momentum_sync
        What a client's momentum does at a synchronisation inside a trajectory: ``"local"``
        (default, nothing more on the wire) keeps it, ``"average"`` replaces it by the clients'
        weighted average (``d`` more floats up and down per round). No effect, and nothing
        sent, when every round starts a trajectory (``K`` divides the steps per round).
    step_decay
        The dynamic step of Proposition 4.5 (:func:`fedmcmc.samplers.schedules.doubling_stages`):
        ``step_size`` for the first ``step_decay`` trajectories, then stages of doubling length,
        the step divided by ``sqrt(2)`` at each. None (default): the constant ``step_size``.
    """
    step_size = checks.step_size(step_size) if step_decay is None else doubling_stages(step_size, step_decay)
    w_np = checks.client_weights(weights)
    num_leapfrog = checks.positive_int("num_leapfrog", num_leapfrog)
    local_steps = checks.positive_int("local_steps", local_steps)
    steps = steps_per_round(num_leapfrog, local_steps, clock)
    checks.choice("momentum_sync", momentum_sync, MOMENTUM_SYNCS, ': "local" (each client keeps its momentum) or '
                  '"average" (momenta averaged with the positions)')
    rho = checks.unit_interval("correlation rho", correlation)
    gradient_noise = checks.non_negative("gradient_noise", gradient_noise, " (a standard deviation)")
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    # momenta cross a synchronisation only if a round can end inside a trajectory
    spanning = steps % num_leapfrog != 0
    s = _Settings(model=model, weights=jnp.asarray(w_np, jnp.float32), step_size=step_size,
                  num_leapfrog=num_leapfrog, steps=steps, sqrt_rho=np.float32(np.sqrt(rho)),
                  sqrt_1m_rho=np.float32(np.sqrt(1.0 - rho)), oracle=gradients.minibatch_gradient(model, batch_size),
                  exact=batch_size is None, gradient_noise=gradient_noise,
                  control=scaffold.scaffold() if debiased else scaffold.none(), compressor=compressor,
                  participation=participation, keep_momentum=spanning and momentum_sync == "local",
                  average_momentum=spanning and momentum_sync == "average")
    clients = per_client_count(w_np, batch_size, compressor.omega(model.dim), known=(participation.num_clients,))
    if clients is None:
        clients = w_np.size
    return FederatedSampler(partial(_init, s), partial(_client_init, s), partial(_client_step, s),
                            partial(_server_step, s), participation, name, clients)


def fa_ld(model: Model, weights, step_size, local_steps: int, correlation: float = 0.0, batch_size=None,
          gradient_noise: float = 0.0, debiased: bool = False, compressor=None,
          participation: Participation | None = None, name: str = "fa-ld", *,
          step_decay: int | None = None) -> FederatedSampler:
    """FA-LD (Deng et al., 2021): FA-HMC with one leapfrog step per trajectory,

        theta^(c) <- theta^(c) - (eta^2 / 2) g(theta^(c)) + eta p^(c),

    i.e. Langevin dynamics with learning rate ``eta^2 / 2`` on ``f^(c)``, averaged every
    ``T`` steps (with ``K = 1`` the two clocks of :func:`fa_hmc` coincide). Parameters as
    :func:`fa_hmc`.
    """
    return fa_hmc(model, weights, step_size, 1, local_steps, correlation, batch_size, gradient_noise,
                  debiased, compressor, participation, name, step_decay=step_decay)
