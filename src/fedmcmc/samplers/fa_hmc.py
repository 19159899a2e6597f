"""FA-HMC: federated averaging of stochastic-gradient Hamiltonian Monte Carlo
(Liang, Zhang, Deng, Lin, Song, 2024), with FA-LD (Deng et al., 2021) as K = 1.

Client ``c`` holds ``w_c`` (``sum_c w_c = 1``, usually ``n_c / n``) and the local potential

    f^(c)(theta) = U_c(theta) / w_c + U_0(theta),    so that    f = sum_c w_c f^(c) = U_0 + sum_c U_c,

with ``U_c = -sum_j log p(x_cj | theta)`` on its own data and ``U_0 = -log prior`` (the prior
enters ``f`` once).

**The stochastic leapfrog step** (Algorithm 1). From ``(theta, p)`` with step ``eta``,

    theta' = theta + eta p - (eta^2 / 2) g(theta, xi_k),
    p'     = p - (eta / 2) g(theta, xi_k) - (eta / 2) g(theta', xi_{k+1/2}),

written as kick ``(eta / 2)``, drift ``eta``, kick ``(eta / 2)``. ``g`` is a stochastic gradient of
``f^(c)``: exact, a minibatch estimate, or exact plus N(0, sigma^2 I) noise (the paper's SG
setting). Every half-kick draws its own gradient: the closing half-kick of a step uses
``xi_{k+1/2}`` and the next step's opening half-kick a fresh ``xi_{k+1}`` at the same point, so
the momentum receives two independent gradient noises of weight ``eta / 2`` per interior point
(variance ``eta^2 sigma^2 / 2`` per step, not the ``eta^2 sigma^2`` of one reused draw). Only
what is deterministic is reused: the exact gradient (so exact runs cost one gradient a step),
and the exact part of an exact-plus-noise gradient (a fresh noise, no new evaluation); a
minibatch gradient costs two evaluations a step.

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

With ``K = 1`` both clocks coincide and a step is ``theta <- theta - (eta^2 / 2) g(theta) + eta
p``: FA-LD with learning rate ``eta^2 / 2``, the form :func:`fa_ld` exposes.

**De-biased FA-HMC** (Algorithm B.2, SCAFFOLD-style) replaces ``g`` by

    g(theta) - h_c + sum_j w_j h_j,      h_j = grad f^(j)(theta_s) (exact),

where ``theta_s`` is the synchronisation point at which every ``h_j`` was computed. Each
client computes ``h_c`` at the ``theta`` it receives and uploads it with its change (32 bits
a coordinate); the server broadcasts ``sum_j w_j h_j`` with the next ``theta``, so the
correction of a round uses the gradients of the previous synchronisation (``theta_{t-T}`` in
Algorithm B.2), as SCAFFOLD's control variates do, at no extra round trip. On either clock
the synchronisations are the rounds. Summed over clients the correction is zero, so the
averaged drift is exactly ``grad f``; what it removes is the client drift caused by
heterogeneous local potentials. In the first round no ``h`` is known and the correction is
zero. Under partial participation the server keeps the last ``h_j`` of every client.

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

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation as participation_lib
from fedmcmc.core.base import FederatedSampler, Model, Participation, per_client_count
from fedmcmc.compression import identity
from fedmcmc.samplers.messages import ClientInfo, ServerInfo, float_bits
from fedmcmc.core.types import resolve_schedule

_SEED_BITS = 64  # the shared momentum seed is one PRNG key: two uint32
#: What ``local_steps`` (T) counts: leapfrog steps (the paper's experiments) or trajectories (Algorithm 3).
CLOCKS = ("leapfrog", "trajectory")
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


class StochasticGradient(NamedTuple):
    """A stochastic gradient ``g(xi, theta) = m(xi, theta) + e(xi)``: an evaluation ``m`` and an
    additive noise ``e``.

    Attributes
    ----------
    evaluate
        ``evaluate(key, theta)``: the evaluation ``m``, exact or a minibatch estimate.
    noise
        ``noise(key, theta)``: zero-mean noise added to every draw (e.g. N(0, sigma^2 I)), or None.
    deterministic
        ``evaluate`` ignores its key (an exact gradient): a new draw at the same point reuses the
        evaluation and draws only a new noise.
    """

    evaluate: Callable[[Any, Any], Any]
    noise: Callable[[Any, Any], Any] | None = None
    deterministic: bool = False

    def sample(self, key, theta, evaluation=None):
        """A draw at ``theta`` with its own randomness ``key``; returns ``(g, m)``, the draw and
        its evaluation. ``evaluation``, the one at ``theta``, is reused if ``deterministic``."""
        key_eval, key_noise = jax.random.split(key)
        m = evaluation if self.deterministic and evaluation is not None else self.evaluate(key_eval, theta)
        return (m if self.noise is None else m + self.noise(key_noise, theta)), m


def as_stochastic_gradient(grad) -> StochasticGradient:
    """``grad`` itself if a :class:`StochasticGradient`, else ``grad(key, theta)`` as one (a fresh
    evaluation at every draw)."""
    return grad if isinstance(grad, StochasticGradient) else StochasticGradient(grad)


def leapfrog_step(grad: StochasticGradient, key, theta, momentum, evaluation, step_size):
    """One stochastic leapfrog step (Algorithm 1) with two independent gradient draws:

        p_half = p - (eta / 2) g(theta, xi_k),    theta' = theta + eta p_half,
        p'     = p_half - (eta / 2) g(theta', xi_{k+1/2}),

    the opening draw from ``fold_in(key, 0)`` and the closing one from ``fold_in(key, 1)``.
    ``evaluation`` is the one at ``theta`` (reused only by a deterministic ``grad``). Returns
    ``(theta', p', m')`` with ``m'`` the evaluation at ``theta'``.
    """
    g, _ = grad.sample(jax.random.fold_in(key, 0), theta, evaluation)
    p = momentum - 0.5 * step_size * g
    theta = theta + step_size * p
    g, evaluation = grad.sample(jax.random.fold_in(key, 1), theta)
    return theta, p - 0.5 * step_size * g, evaluation


def leapfrog(grad, key, theta, momentum, evaluation, step_size, num_steps: int):
    """``num_steps`` stochastic leapfrog steps (:func:`leapfrog_step`) of size ``step_size``.

    ``grad`` is a :class:`StochasticGradient` or a function ``grad(key, theta)`` (then drawn
    anew at every half-kick); step ``i`` draws from ``fold_in(key, i)``. ``evaluation`` is the
    gradient evaluation at ``theta`` (used only by a deterministic gradient, so a trajectory of
    exact gradients costs ``num_steps`` evaluations), or None. Returns ``(theta, momentum,
    evaluation)`` with ``evaluation`` the one at the final ``theta``.
    """
    grad = as_stochastic_gradient(grad)
    if evaluation is None:
        evaluation = grad.evaluate(key, theta) if grad.deterministic else jnp.zeros_like(theta)

    def step(i, carry):
        return leapfrog_step(grad, jax.random.fold_in(key, i), *carry, step_size)

    return jax.lax.fori_loop(0, num_steps, step, (theta, momentum, evaluation))


def steps_per_round(num_leapfrog: int, local_steps: int, clock: str) -> int:
    """Leapfrog steps per round: ``T`` on the leapfrog clock, ``K T`` on the trajectory clock."""
    checks.choice("clock", clock, CLOCKS, ': "leapfrog" (T counts leapfrog steps, the paper\'s experiments) or '
                  '"trajectory" (T counts trajectories of K steps, Algorithm 3)')
    return local_steps * num_leapfrog if clock == "trajectory" else local_steps


def round_trajectories(k, steps: int, num_leapfrog: int):
    """Where the trajectories of round ``k`` start, for ``steps`` leapfrog steps per round.

    Returns ``(first, count, counter)``: the first trajectory starts at the round's local step
    ``first`` (``0 <= first < K``; the steps before it finish the previous one), ``count``
    trajectories start in the round (at ``first + j K``), and ``counter`` is the global index
    ``floor(n / K)`` of the trajectory running at the round's first step. Static Python ints
    when ``K`` divides ``steps``; otherwise computed from ``k`` without forming ``k * steps``
    (no int32 overflow in long runs).
    """
    K = num_leapfrog
    q, r = divmod(steps, K)
    if r == 0:
        return 0, q, k * q
    k_mod = k % K
    offset = (k_mod * r) % K                      # (k * steps) mod K
    first = (K - offset) % K
    count = (steps - first + K - 1) // K
    counter = k * q + (k // K) * r + (k_mod * r) // K  # floor(k * steps / K)
    return first, count, counter


def fa_hmc(model: Model, weights, step_size, num_leapfrog: int, local_steps: int, correlation: float = 0.0,
           batch_size=None, gradient_noise: float = 0.0, debiased: bool = False, compressor=None,
           participation: Participation | None = None, name: str = "fa-hmc", *, clock: str = "leapfrog",
           momentum_sync: str = "local") -> FederatedSampler:
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
    """
    step_size = checks.step_size(step_size)
    w_np = checks.client_weights(weights)
    num_leapfrog = checks.positive_int("num_leapfrog", num_leapfrog)
    local_steps = checks.positive_int("local_steps", local_steps)
    steps = steps_per_round(num_leapfrog, local_steps, clock)
    checks.choice("momentum_sync", momentum_sync, MOMENTUM_SYNCS, ': "local" (each client keeps its momentum) or '
                  '"average" (momenta averaged with the positions)')
    correlation = checks.unit_interval("correlation rho", correlation)
    gradient_noise = checks.non_negative("gradient_noise", gradient_noise, " (a standard deviation)")
    compressor = identity() if compressor is None else compressor
    participation = participation_lib.full() if participation is None else participation
    oracle = gradients.minibatch_gradient(model, batch_size)
    w_all = jnp.asarray(w_np, jnp.float32)
    rho = float(correlation)
    sqrt_rho, sqrt_1m_rho = np.float32(np.sqrt(rho)), np.float32(np.sqrt(1.0 - rho))
    # momenta cross a synchronisation only if a round can end inside a trajectory
    spanning = steps % num_leapfrog != 0
    keep_momentum = spanning and momentum_sync == "local"
    average_momentum = spanning and momentum_sync == "average"

    def client_gradient(client_data, w_c, shift) -> StochasticGradient:
        """The stochastic gradient of f^(c) (plus the de-biasing shift, if any)."""

        def evaluate(key, theta):
            g = oracle(key, theta, client_data) / w_c - jax.grad(model.log_prior)(theta)
            return g if shift is None else g + shift

        noise = None
        if gradient_noise > 0:
            def noise(key, theta):
                return np.float32(gradient_noise) * jax.random.normal(key, theta.shape, theta.dtype)
        return StochasticGradient(evaluate, noise, deterministic=batch_size is None)

    def exact_local_grad(theta, client_data, w_c):
        return gradients.local_gradient(model, theta, client_data) / w_c - jax.grad(model.log_prior)(theta)

    def draw_momentum(seed, key_grad, j, w_c, like):
        """The momentum of the round's j-th trajectory: shared xi from the seed, private xi^(c)."""
        xi = jax.random.normal(jax.random.fold_in(seed, j), like.shape, like.dtype)
        xi_c = jax.random.normal(jax.random.fold_in(jax.random.fold_in(key_grad, j), 0), like.shape, like.dtype)
        return sqrt_rho * xi + (sqrt_1m_rho / jnp.sqrt(w_c)) * xi_c

    def eta_at(counter):
        return jnp.asarray(resolve_schedule(step_size, counter), jnp.float32)

    def init(key, theta0):
        theta0 = jnp.asarray(theta0, jnp.float32)
        anchors = jnp.zeros((w_np.size,) + theta0.shape, jnp.float32) if debiased else ()
        correction = jnp.zeros_like(theta0) if debiased else ()
        momentum = jnp.zeros_like(theta0) if average_momentum else ()  # round 0 starts a trajectory
        return FAState(theta0, anchors, momentum), FABroadcast(theta0, key, correction, momentum)

    def client_init(key, broadcast, client_data):
        anchor = jnp.zeros_like(broadcast.position) if debiased else ()
        momentum = ()
        if keep_momentum:  # redrawn at step 0; a client absent from round 0 starts with this draw
            w_c = w_all[client_data.index]
            momentum = draw_momentum(broadcast.seed, key, 0, w_c, broadcast.position)
        return FAClientState(compressor.init(broadcast.position, client_data.index), anchor, momentum)

    def client_step(key, client_state, broadcast, client_data, k):
        w_c = w_all[client_data.index]
        theta0 = broadcast.position
        key_grad, key_comp = jax.random.split(key)
        key_steps = jax.random.fold_in(jax.random.fold_in(key_grad, 0), 1)
        shift = broadcast.correction - client_state.anchor if debiased else None
        grad = client_gradient(client_data, w_c, shift)
        # the evaluation at theta0, reused by the first half-kick if the gradient is exact
        m0 = grad.evaluate(key_grad, theta0) if grad.deterministic else jnp.zeros_like(theta0)
        if keep_momentum:
            p0 = client_state.momentum
        elif average_momentum:
            p0 = broadcast.momentum
        else:
            p0 = jnp.zeros_like(theta0)  # never used: the round starts a trajectory

        def run(start, length, eta, carry):
            """Leapfrog steps start .. start + length - 1 of the round (length static if K | steps)."""
            def step(i, c):
                return leapfrog_step(grad, jax.random.fold_in(key_steps, start + i), *c, eta)
            return jax.lax.fori_loop(0, length, step, carry)

        first, count, counter = round_trajectories(k, steps, num_leapfrog)
        carry = (theta0, p0, m0)
        if spanning:  # finish the trajectory begun in an earlier round
            carry = run(0, jnp.minimum(first, steps), eta_at(counter), carry)
            counter = counter + (first > 0)

        def trajectory(j, carry):
            theta, _, m = carry
            p = draw_momentum(broadcast.seed, key_grad, j, w_c, theta)
            start = first + j * num_leapfrog
            length = jnp.minimum(num_leapfrog, steps - start) if spanning else num_leapfrog
            return run(start, length, eta_at(counter + j), (theta, p, m))

        theta, p, _ = jax.lax.fori_loop(0, count, trajectory, carry)
        message, comp_state, cinfo = compressor.apply(key_comp, theta - theta0, client_state.compressor)
        bits = cinfo.bits
        anchor = ()
        if debiased:
            anchor = exact_local_grad(theta0, client_data, w_c)
            bits = bits + float_bits(anchor)
        momentum_up = ()
        if average_momentum:
            momentum_up = p - p0
            bits = bits + float_bits(momentum_up)
        state = FAClientState(comp_state, anchor, p if keep_momentum else ())
        return state, FAUpload(message, anchor, momentum_up), ClientInfo(bits=bits)

    def server_step(key, server_state, uploads, mask, k):
        a = participation.weights(mask) * w_all
        position = server_state.position + jnp.tensordot(a, jax.vmap(compressor.decode)(uploads.delta), axes=1)
        anchors, correction, momentum = (), (), ()
        if debiased:
            anchors = jnp.where(mask[:, None], uploads.anchor, server_state.anchors)
            correction = jnp.tensordot(w_all, anchors, axes=1)
        if average_momentum:
            momentum = server_state.momentum + jnp.tensordot(a, uploads.momentum, axes=1)
        new = participation_lib.hold_if_empty(participation, mask, FAState(position, anchors, momentum),
                                              server_state)
        eta = eta_at(round_trajectories(k, steps, num_leapfrog)[2])
        broadcast = FABroadcast(new.position, key, correction, new.momentum)
        bits = (float_bits(new.position) + _SEED_BITS + (float_bits(correction) if debiased else 0)
                + (float_bits(new.momentum) if average_momentum else 0))
        return new, broadcast, ServerInfo(step_size=eta, broadcast_bits=jnp.asarray(bits, jnp.int32))

    clients = per_client_count(w_np, batch_size, compressor.omega(model.dim),
                               known=(participation.num_clients,))
    if clients is None:
        clients = w_np.size
    return FederatedSampler(init, client_init, client_step, server_step, participation, name, clients)


def fa_ld(model: Model, weights, step_size, local_steps: int, correlation: float = 0.0, batch_size=None,
          gradient_noise: float = 0.0, debiased: bool = False, compressor=None,
          participation: Participation | None = None, name: str = "fa-ld") -> FederatedSampler:
    """FA-LD (Deng et al., 2021): FA-HMC with one leapfrog step per trajectory,

        theta^(c) <- theta^(c) - (eta^2 / 2) g(theta^(c)) + eta p^(c),

    i.e. Langevin dynamics with learning rate ``eta^2 / 2`` on ``f^(c)``, averaged every
    ``T`` steps (with ``K = 1`` the two clocks of :func:`fa_hmc` coincide). Parameters as
    :func:`fa_hmc`.
    """
    return fa_hmc(model, weights, step_size, 1, local_steps, correlation, batch_size, gradient_noise,
                  debiased, compressor, participation, name)
