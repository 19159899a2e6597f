"""The clients as the server's estimators see them: named computations on each client's own rows.

An estimator that needs the data -- the federated mode (:func:`fedmcmc.estimators.gradients.find_mode`),
the curvature (:mod:`fedmcmc.estimators.curvature`), the Laplace approximation
(:mod:`fedmcmc.estimators.approximation`) -- runs on the server: each of its rounds broadcasts a
few arrays and asks every client for one of the :data:`COMPUTATIONS` on its own rows; the server
combines the answers itself, in client order, in float64. A :class:`Federation` gives the
answers of one round as ``[b, ...]`` arrays:

* :class:`Local` (the simulator, or any process that holds every client's rows) computes them in
  one program (:func:`program`), the clients under ``vmap``, bucket by bucket;
* over Flower, the server's federation (:class:`fedmcmc.app.flower.asks.Remote`) sends an ``ask``
  message, and each node runs the same program on its own rows in the run's layout (the other
  clients' rows zeros), as ``b`` copies of itself when ``[flower] exact`` (the simulator's batch of
  ``b``, so the same bits), and uploads its row.

So an estimator written against a :class:`Federation` gives the same result, bit for bit, in the
simulator and over Flower. A client's potential is ``U_c(theta) = -sum_j log p(x_cj | theta)``
(its points weighted 1, padding 0); the prior is the server's.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import Model, Rows


def _potential(model: Model, x, w) -> Callable:
    def u(theta):
        return -jnp.sum(w * jax.vmap(model.log_likelihood, in_axes=(None, 0))(theta, x))

    return u


def _value_grad(model, x, w, c, theta):
    return jax.value_and_grad(_potential(model, x, w))(theta)


def _newton(model, x, w, c, theta):
    u = _potential(model, x, w)
    value, grad = jax.value_and_grad(u)(theta)
    return value, grad, jax.hessian(u)(theta)


def _value(model, x, w, c, theta):
    return _potential(model, x, w)(theta)


def _hvp(model, x, w, c, theta, v):
    return jax.jvp(jax.grad(_potential(model, x, w)), (theta,), (v,))[1]


def _hessian(model, x, w, c, theta):
    return jax.hessian(_potential(model, x, w))(theta)


def hessian_diagonal(f: Callable, theta):
    """``diag nabla^2 f(theta)`` from ``d`` Hessian-vector products (no ``d x d`` matrix kept)."""
    grad = jax.grad(f)
    return jax.vmap(lambda e: jnp.vdot(e, jax.jvp(grad, (theta,), (e,))[1]))(jnp.eye(theta.shape[0], dtype=theta.dtype))


def _hessian_diag(model, x, w, c, theta):
    return hessian_diagonal(_potential(model, x, w), theta)


def _drift(model, x, w, c, theta, shares, metric):
    """``(g_c, A_c M g_c)`` of the local potential ``f_c = U_c / s_c - log prior``, ``s_c = shares[c]``,
    ``M`` the broadcast ``metric`` (``[d, d]``, or ``[d]`` for a diagonal one):
    :func:`fedmcmc.estimators.curvature.heterogeneity`."""
    def f(t):
        return _potential(model, x, w)(t) / shares[c] - model.log_prior(t)

    g = jax.grad(f)(theta)
    return g, jax.jvp(jax.grad(f), (theta,), (_apply(metric, g),))[1]


def _apply(matrix, v):
    """``M v`` for a ``[d, d]`` matrix, or a ``[d]`` diagonal."""
    return matrix @ v if matrix.ndim == 2 else matrix * v


#: Rows per chunk of the per-point Hessian-vector products of ``noise``.
NOISE_CHUNK = 256


def _noise(model, x, w, c, theta, v, cov):
    """``sum_j H_j S (H_j v)`` over the client's points, ``S`` the broadcast ``cov`` (``[d, d]``, or
    ``[d]`` for a diagonal one): :func:`fedmcmc.estimators.curvature.minibatch_noise`."""
    def point_hvp(xj, u):
        return jax.jvp(jax.grad(lambda t: -model.log_likelihood(t, xj)), (theta,), (u,))[1]

    def one(args):
        xj, wj = args
        return jnp.where(wj > 0, wj * point_hvp(xj, _apply(cov, point_hvp(xj, v))), 0.0)

    return jnp.sum(jax.lax.map(one, (x, w), batch_size=NOISE_CHUNK), axis=0)


def _noise_matrix(model, x, w, c, theta, cov):
    """``sum_j H_j S H_j`` over the client's points (``[d, d]``; ``S`` as for ``noise``)."""
    def one(args):
        xj, wj = args
        h = jax.hessian(lambda t: -model.log_likelihood(t, xj))(theta)
        return jnp.where(wj > 0, wj * (h @ (cov @ h if cov.ndim == 2 else cov[:, None] * h)), 0.0)

    return jnp.sum(jax.lax.map(one, (x, w), batch_size=NOISE_CHUNK), axis=0)


#: The computations a server may ask its clients for, by the name its ``ask`` message carries:
#: ``fn(model, x, w, c, *broadcast)`` on client ``c``'s rows ``x`` with weights ``w``.
COMPUTATIONS: dict[str, Callable] = {
    "value": _value,
    "value_grad": _value_grad,
    "newton": _newton,
    "hvp": _hvp,
    "hessian": _hessian,
    "hessian_diag": _hessian_diag,
    "drift": _drift,
    "noise": _noise,
    "noise_matrix": _noise_matrix,
}


def program(model: Model, name: str) -> Callable:
    """``(rows, args, index) -> answers``: computation ``name`` of each client ``index`` (an int32
    ``[w]``) at ``args`` on its rows of ``rows``, every bucket's clients at once (jitted). The
    answers' leading axis is the batch's."""
    from fedmcmc.estimators.gradients import _in_batch_order, bucket_rows

    fn = COMPUTATIONS[name]

    def run(rows: Rows, args, index):
        parts = [jax.vmap(lambda x_c, w_c, c: fn(model, x_c, w_c, c, *args))(xs, w, clients)
                 for xs, w, clients in bucket_rows(rows)]
        return _in_batch_order(parts, jnp.asarray(rows.order), index)

    return jax.jit(run)


def as_arguments(args) -> tuple:
    """The broadcast arrays of an ask, as the clients receive them (float32)."""
    return tuple(np.asarray(a, np.float32) for a in args)


class Federation(Protocol):
    """The clients of a run, as the server's estimators reach them.

    ``ask(name, *args)`` is one round: every client computes ``COMPUTATIONS[name]`` at the
    broadcast ``args`` (float32 arrays) on its own rows; the answers come back as NumPy arrays
    with a leading client axis (a tuple of them for a computation of several outputs), in
    client order. The estimators count the rounds and bits of their own protocol."""

    num_clients: int
    counts: Any

    def ask(self, name: str, *args): ...


class Local:
    """Every client's rows in this process (``data``, a :class:`~fedmcmc.data.federated.FederatedData`):
    the answers of :func:`program` over all clients at once."""

    def __init__(self, model: Model, data):
        self.model, self.data, self.num_clients, self.counts = model, data, data.num_clients, data.counts
        self.rows = None  # on the first ask: a run that asks nothing copies no rows
        self.programs: dict[str, Callable] = {}

    def ask(self, name: str, *args):
        if self.rows is None:
            self.rows = jax.tree_util.tree_map(jnp.asarray, self.data.rows())
        if name not in self.programs:
            self.programs[name] = program(self.model, name)
        index = jnp.arange(self.num_clients, dtype=jnp.int32)
        return jax.tree_util.tree_map(np.asarray, self.programs[name](self.rows, as_arguments(args), index))

    def client(self, i: int):
        """Client ``i``'s data (the local fits of CG-DSGLD's surrogates, in this process only)."""
        return self.data.client(i)


class Whitened:
    """The federation ``base`` (clients of the model in ``theta``) as the whitened model
    (:func:`fedmcmc.models.whitened`) sees it, ``theta = c + L z``: the server maps each broadcast
    to ``theta`` and each answer back (``L' g``, ``L' H L``); the clients never see the map."""

    def __init__(self, base: Federation, whitening):
        self.base, self.w = base, whitening
        self.num_clients, self.counts = base.num_clients, base.counts
        self.lower = np.asarray(whitening.factor, np.float64)

    def client(self, i: int):
        return self.base.client(i)

    def _theta(self, z):
        return self.w.to_theta(np.asarray(z, np.float64))

    def _l(self, v):  # L v (rows of v: its last axis)
        return v @ self.lower.T if self.w.full else v * self.lower

    def _lt(self, g):  # L' g, per client row
        return g @ self.lower if self.w.full else g * self.lower

    def _sandwich(self, h):  # L' H L, per client
        if self.w.full:
            return np.einsum("de,cdf,fg->ceg", self.lower, h, self.lower)
        return h * self.lower[:, None] * self.lower[None, :]

    def _metric(self, m):  # L M L' of a metric in z (None: the identity)
        if m is None:
            return self.lower @ self.lower.T if self.w.full else self.lower ** 2
        m = np.asarray(m, np.float64)
        if not self.w.full:
            return self.lower * m * self.lower if m.ndim == 1 else self.lower[:, None] * m * self.lower[None, :]
        return self.lower @ (np.diag(m) if m.ndim == 1 else m) @ self.lower.T

    def ask(self, name: str, z, *args):
        theta = self._theta(z)
        if name == "value":
            return self.base.ask(name, theta)
        if name == "value_grad":
            value, g = self.base.ask(name, theta)
            return value, self._lt(np.asarray(g, np.float64))
        if name == "newton":
            value, g, h = self.base.ask(name, theta)
            return value, self._lt(np.asarray(g, np.float64)), self._sandwich(np.asarray(h, np.float64))
        if name == "hvp":
            return self._lt(np.asarray(self.base.ask(name, theta, self._l(np.asarray(args[0], np.float64))), np.float64))
        if name == "hessian":
            return self._sandwich(np.asarray(self.base.ask(name, theta), np.float64))
        if name == "hessian_diag":
            if self.w.full:
                return np.einsum("cdd->cd", self._sandwich(np.asarray(self.base.ask("hessian", theta), np.float64)))
            return np.asarray(self.base.ask(name, theta), np.float64) * self.lower ** 2
        if name == "drift":  # g_z = L' g, A_z M_z g_z = L' A (L M_z L') g
            shares, metric = args
            g, ag = self.base.ask(name, theta, shares, self._metric(metric))
            return self._lt(np.asarray(g, np.float64)), self._lt(np.asarray(ag, np.float64))
        if name == "noise":  # sum_j L' H_j L S L' H_j L v
            v, cov = args
            return self._lt(np.asarray(self.base.ask(name, theta, self._l(np.asarray(v, np.float64)),
                                                     self._metric(cov)), np.float64))
        if name == "noise_matrix":  # L' [sum_j H_j (L S L') H_j] L
            return self._sandwich(np.asarray(self.base.ask(name, theta, self._metric(args[0])), np.float64))
        raise ValueError(f"unknown computation {name!r}; choose one of {tuple(COMPUTATIONS)}")


def federation(model: Model, data) -> Federation:
    """``data`` as a federation: itself if it is one, else :class:`Local` over its rows."""
    return data if hasattr(data, "ask") else Local(model, data)
