"""The curvature of the posterior potential at the federated mode, by federated Hessian-vector
power iteration.

With ``U(theta) = U_0(theta) + sum_c U_c(theta)`` (``U_0 = -log prior``, ``U_c`` client ``c``'s
negative log-likelihood) and ``H = nabla^2 U(theta*)``, one *round* computes ``H v``:

* the server broadcasts ``v`` (``d`` float32 values to each of the ``b`` clients: ``32 d b``
  bits down);
* client ``c`` returns ``H_c v = nabla^2 U_c(theta*) v`` of its own data (``32 d`` bits up
  each), by forward-over-reverse differentiation (``jax.jvp`` of ``jax.grad``), without ever
  forming ``H_c``;
* the server adds the prior's ``H_0 v`` (no communication) and sums.

The power iteration ``v <- H v / ||H v||`` from a random start gives ``lambda_max`` as the
Rayleigh quotient ``v' H v``, which increases to it; it stops when two successive quotients
agree to ``tol`` (relative). The smallest eigenvalue follows from the same iteration on the
shifted matrix ``lambda_max I - H`` (same rounds: the shift is the server's), whose largest
eigenvalue is ``lambda_max - lambda_min``. That iteration converges slowly when ``H`` is
ill-conditioned (its ratio of leading eigenvalues is close to 1), so it runs under its own
round budget and reports whether it converged; the step-size rules use ``lambda_max`` only,
``lambda_min`` is what sets how many iterations a chain needs (``1 / (gamma lambda_min)``
for Langevin dynamics).

Up to :data:`fedmcmc.estimators.gradients.FULL_HESSIAN_DIM` parameters one round of Hessians
replaces the power iterations (each client uploads the upper triangle of ``H_c``, ``32 d (d + 1)
/ 2`` bits): the eigenvalues are then exact, and a deployment whose rounds cost seconds pays one
round instead of up to ``max_rounds + max_rounds_smallest``. :func:`minibatch_noise` does the same
with each client's ``sum_j H_j S H_j``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.estimators.gradients import FULL_HESSIAN_DIM, _summed


class Curvature(NamedTuple):
    """Extreme eigenvalues of ``nabla^2 U(theta*)`` and what estimating them cost.

    Attributes
    ----------
    lambda_max
        The largest eigenvalue (a lower bound that converged to ``tol``).
    lambda_min
        The smallest eigenvalue (an upper bound), or None if not estimated.
    converged
        Whether each iteration met its tolerance within its rounds (``lambda_min``'s included
        when estimated).
    rounds
        Federated rounds: one Hessian-vector product each.
    bits_up, bits_down
        ``32 d b`` bits per round each way (every client returns ``H_c v``, receives ``v``).
    hessians
        From the one round of Hessians: ``([b, d, d] H_c, [d, d] H_0)``, the clients' likelihood
        Hessians and the prior's; None from the power iterations.
    """

    lambda_max: float
    lambda_min: float | None
    converged: bool
    rounds: int
    bits_up: int
    bits_down: int
    hessians: tuple | None = None


def federated_hvp(model: Model, data, theta) -> Callable:
    """``v -> H v`` at ``theta``: the clients' ``H_c v`` (an ``hvp`` ask of ``data``, a
    :class:`~fedmcmc.data.federated.FederatedData` or a :class:`~fedmcmc.estimators.federation.Federation`)
    summed in client order, plus the prior's ``H_0 v``. One call is one round."""
    from fedmcmc.estimators.federation import federation

    fed, theta = federation(model, data), np.asarray(theta, np.float32)
    prior = jax.jit(lambda v: -jax.jvp(jax.grad(model.log_prior), (jnp.asarray(theta),), (v,))[1])

    def hvp(v):
        v = np.asarray(v, np.float32)
        return _summed(fed.ask("hvp", theta, v), prior(v))

    return hvp


def power_iteration(key, matvec: Callable, dim: int, max_iterations: int, tol: float):
    """The largest eigenvalue of a symmetric positive semi-definite operator ``matvec``.

    Returns ``(eigenvalue, iterations, converged)``: the last Rayleigh quotient ``v' A v``
    (``||v|| = 1``), the number of products used, and whether two successive quotients
    agreed to ``tol`` relatively. The start ``v`` is standard normal from ``key``.
    """
    v = jax.random.normal(key, (dim,), jnp.float32)
    v = v / jnp.linalg.norm(v)
    previous = None
    for i in range(1, max_iterations + 1):
        w = np.asarray(matvec(v), np.float64)
        quotient = float(np.dot(np.asarray(v, np.float64), w))
        norm = float(np.linalg.norm(w))
        if not np.isfinite(norm):
            raise ValueError(f"the Hessian-vector product is not finite after {i} rounds; is the mode finite?")
        if norm == 0.0 or (previous is not None and abs(quotient - previous) <= tol * abs(quotient)):
            return quotient, i, True
        previous = quotient
        v = jnp.asarray(w / norm, jnp.float32)
    return previous, max_iterations, False


def curvature(key, model: Model, data, theta, max_rounds: int = 200, tol: float = 1e-4,
              smallest: bool = False, max_rounds_smallest: int = 200, full_dim: int | None = None) -> Curvature:
    """Estimate the extreme eigenvalues of ``nabla^2 U(theta)`` by federated power iteration.

    Parameters
    ----------
    key
        Start vectors: ``fold_in(key, 0)`` for ``lambda_max``, ``fold_in(key, 1)`` for ``lambda_min``.
    model, data
        The potential ``U = -log prior - sum_c sum_j log p(x_cj | theta)``.
    theta
        Where (the federated mode, :func:`fedmcmc.estimators.gradients.find_mode`).
    max_rounds, tol
        Round budget and relative tolerance of the iteration for ``lambda_max``.
    smallest, max_rounds_smallest
        Also estimate ``lambda_min`` (shifted iteration), with its own round budget.
    full_dim
        Up to this many parameters, one round of Hessians and their exact eigenvalues instead
        (:data:`fedmcmc.estimators.gradients.FULL_HESSIAN_DIM` if None; 0: always the power iterations).
    """
    if int(max_rounds) != max_rounds or max_rounds < 2:
        raise ValueError(f"max_rounds must be an integer >= 2 (got {max_rounds!r})")
    if not 0 < tol < 1:
        raise ValueError(f"tol must lie in (0, 1) (got {tol!r})")
    d = int(model.dim)
    if d <= (FULL_HESSIAN_DIM if full_dim is None else full_dim):
        return _exact(model, data, theta, smallest)
    hvp = federated_hvp(model, data, theta)
    top, rounds, converged = power_iteration(jax.random.fold_in(key, 0), hvp, d, int(max_rounds), tol)
    low = None
    if smallest:
        shifted = lambda v: top * v - hvp(v)  # noqa: E731 -- the server's shift, no extra round
        gap, extra, converged_low = power_iteration(jax.random.fold_in(key, 1), shifted, d,
                                                    int(max_rounds_smallest), tol)
        low, rounds, converged = top - gap, rounds + extra, converged and converged_low
    bits = rounds * data.num_clients * 32 * d
    return Curvature(top, low, converged, rounds, bits, bits)


def _exact(model: Model, data, theta, smallest: bool) -> Curvature:
    """:class:`Curvature` from one round of the clients' Hessians: exact eigenvalues."""
    from fedmcmc.estimators.federation import federation

    fed, theta, d = federation(model, data), np.asarray(theta, np.float32), int(model.dim)
    clients = np.asarray(fed.ask("hessian", theta), np.float64)
    prior = -np.asarray(jax.jit(jax.hessian(model.log_prior))(theta), np.float64)
    h = _summed(clients, prior)
    if not np.all(np.isfinite(h)):
        raise ValueError("the Hessian at the mode is not finite; is the mode finite?")
    eig = np.linalg.eigvalsh(0.5 * (h + h.T))
    b = fed.num_clients
    return Curvature(float(eig[-1]), float(eig[0]) if smallest else None, True, 1, b * 32 * d * (d + 1) // 2,
                     b * 32 * d, (clients, prior))


class Heterogeneity(NamedTuple):
    """How far apart the clients' local potentials pull at ``theta`` (the mode), and what it cost.

    With client ``c``'s local potential ``f_c = U_0 + U_c / s_c`` (``s_c`` its share: FA-HMC's
    ``w_c``, DSGLD's visit probability ``f_c``), its gradient ``g_c = grad f_c(theta)`` (they
    average to zero at the mode, ``sum_c s_c g_c = grad U = 0``) and Hessian ``A_c``:

    Attributes
    ----------
    drift
        ``||sum_c s_c A_c g_c||``: what moves the stationary mean of samplers whose chains follow
        one local potential for several steps (:mod:`fedmcmc.samplers.steps`).
    spread
        ``lambda_max(sum_c s_c g_c g_c')``: the covariance of the gradient of a client drawn with
        probabilities ``s_c``, at the mode.
    rounds, bits_up, bits_down
        One round: every client uploads ``g_c`` and ``A_c g_c`` (``2 x 32 d`` bits) and receives theta.
    gradients
        ``[b, d]``: the ``g_c``.
    """

    drift: float
    spread: float
    rounds: int
    bits_up: int
    bits_down: int
    gradients: Any = None


def heterogeneity(model: Model, data, theta, shares) -> Heterogeneity:
    """:class:`Heterogeneity` of ``data``'s clients (a :class:`~fedmcmc.data.federated.FederatedData`
    or a :class:`~fedmcmc.estimators.federation.Federation`) at ``theta`` with shares ``shares`` (one
    per client).

    Each client computes its ``g_c`` and ``A_c g_c`` (a Hessian-vector product) on its own rows
    (a ``drift`` ask); the server sums.
    """
    from fedmcmc.estimators.federation import federation

    fed, theta, d = federation(model, data), np.asarray(theta, np.float32), int(model.dim)
    shares = np.asarray(shares, np.float64)
    g, ag = (np.asarray(a, np.float64) for a in fed.ask("drift", theta, shares, np.ones(d, np.float32)))
    drift = float(np.linalg.norm(shares @ ag))
    scaled = np.sqrt(shares)[:, None] * g
    small = scaled @ scaled.T if scaled.shape[0] <= scaled.shape[1] else scaled.T @ scaled
    bits = fed.num_clients * 32 * d
    return Heterogeneity(drift, float(np.linalg.eigvalsh(small)[-1]), 1, 2 * bits, bits, g)


class MinibatchNoise(NamedTuple):
    """The largest eigenvalue of the points' squared curvatures, weighted by client, and its cost.

    Attributes
    ----------
    lambda_max
        ``lambda_max(sum_c c_c sum_{j in c} H_j^2)``, ``H_j = -nabla^2 log p(x_j | theta)``.
    converged
        Whether the power iteration met its tolerance within its rounds.
    rounds, bits_up, bits_down
        One round per product: every client receives ``v`` and returns its ``32 d`` bits (up
        to ``full_dim`` parameters, one round: each client returns its ``d x d`` sum's triangle).
    """

    lambda_max: float
    converged: bool
    rounds: int
    bits_up: int
    bits_down: int


def minibatch_noise(key, model: Model, data, theta, weights, covariance=None, max_rounds: int = 100,
                    tol: float = 1e-3, full_dim: int | None = None) -> MinibatchNoise:
    """``lambda_max(sum_c c_c sum_{j in c} H_j S H_j)`` at ``theta`` by federated power iteration,
    ``S`` the ``covariance`` (``H^{-1}``, broadcast once) or the identity if None.

    A minibatch of ``n_c`` of client ``c``'s ``N_c`` points, drawn without replacement, estimates
    ``sum_j a_j`` by ``(N_c / n_c) sum_{j in B} a_j`` with covariance ``A_c sum_j (a_j - abar)
    (a_j - abar)'``, ``A_c = N_c (N_c - n_c) / (n_c (N_c - 1))``. For the control-variate
    gradients of QLSD* and QLSD++, ``a_j = grad U_j(theta) - grad U_j(theta') ~ H_j delta``; with
    ``delta ~ N(0, H^{-1})`` at stationarity their noise covariance is at most ``sum_c A_c sum_j
    H_j H^{-1} H_j`` (:mod:`fedmcmc.samplers.steps` reads it with the weights ``c_c``): ``S =
    H^{-1}``, or the identity where the model is whitened (``H = I``).

    Up to ``full_dim`` parameters (:data:`fedmcmc.estimators.gradients.FULL_HESSIAN_DIM` if None)
    each client returns its ``sum_j H_j S H_j`` in one round and the eigenvalue is exact. Beyond,
    in a round the server broadcasts ``v``; client ``c`` returns ``c_c sum_j H_j S (H_j v)`` from
    two Hessian-vector products per point (``jax.jvp`` of ``jax.grad`` of one point's negative
    log-likelihood), :data:`fedmcmc.estimators.federation.NOISE_CHUNK` rows at a time; the server sums. The covariance's broadcast
    (``32 d (d + 1) / 2`` bits to each client) is not counted here.
    """
    from fedmcmc.estimators.federation import federation

    fed, theta, d = federation(model, data), np.asarray(theta, np.float32), int(model.dim)
    cov = np.ones(d, np.float32) if covariance is None else np.asarray(covariance, np.float32)
    weights = np.asarray(weights, np.float64)
    if d <= (FULL_HESSIAN_DIM if full_dim is None else full_dim):  # one round of d x d matrices
        m = np.einsum("c,cde->de", weights, np.asarray(fed.ask("noise_matrix", theta, cov), np.float64))
        if not np.all(np.isfinite(m)):
            raise ValueError("the minibatch noise at the mode is not finite; is the mode finite?")
        up = fed.num_clients * 32 * d * (d + 1) // 2
        return MinibatchNoise(float(np.linalg.eigvalsh(0.5 * (m + m.T))[-1]), True, 1, up, fed.num_clients * 32 * d)

    def matvec(v):
        return weights @ np.asarray(fed.ask("noise", theta, v, cov), np.float64)

    top, rounds, converged = power_iteration(key, matvec, d, int(max_rounds), tol)
    bits = rounds * fed.num_clients * 32 * d
    return MinibatchNoise(top, converged, rounds, bits, bits)
