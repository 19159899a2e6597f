"""Gradient estimators of a client's potential U_i(theta) = -sum_j log p(x_ij | theta).

An *oracle* is a function ``oracle(key, theta, client_data) -> H_i(theta)``, computed by
client ``i`` on its own data. The prior is never part of a client's potential: the
server adds its gradient once.

Minibatches are drawn without replacement, ``n_i = min(batch_size_i, N_i)`` of the client's
``N_i`` points, with fixed shapes so that clients and chains vectorise. By Floyd's algorithm
(``n_i`` uniforms rather than ``N_i`` sort keys) unless ``k^2 > TOP_K_RATIO n_max`` for a
batch of ``k`` rows out of ``n_max``; then by the ``k`` largest of ``n_max`` uniform keys
(``lax.top_k``). Floyd's collision work grows as ``k^2``, top-k's as ``n_max``; docs/design.md,
"Minibatch draws", has the measured break-even. The rule stays as it is, since another rule
would draw other subsets for the same keys.

Clients of other batch sizes draw in buckets of similar sizes when they run together
(:func:`on_minibatch`): a client draws its bucket's width of rows, not the largest client's.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.xla import materialize
from fedmcmc.core.base import ClientData, Model, Rows
from fedmcmc.data.federated import buckets

Oracle = Callable[[Any, Any, ClientData], Any]


class GradientEstimator(NamedTuple):
    """A client's gradient estimator with a state, Optax-shaped (an oracle is the stateless case).

    ``init(broadcast, client_data) -> state`` builds client ``i``'s state from the first
    broadcast; ``estimate(key, state, broadcast, client_data, k) -> (H_i(theta_k), state)``
    estimates ``grad U_i`` at ``theta_k = broadcast.position`` in round ``k``.
    """

    init: Callable[..., Any]
    estimate: Callable[..., tuple]


def stateless(oracle: Oracle) -> GradientEstimator:
    """The estimator of an oracle: no state, ``H_i(theta) = oracle(key, theta, client_data)``."""

    def init(broadcast, client_data):
        del broadcast, client_data
        return ()

    def estimate(key, state, broadcast, client_data, k):
        del k
        return oracle(key, broadcast.position, client_data), state

    return GradientEstimator(init, estimate)


def weighted_potential_grad(model: Model, theta, x, weights):
    """``grad_theta sum_j w_j (-log p(x_j | theta))`` in one backward pass."""

    def potential(t):
        ll = jax.vmap(model.log_likelihood, in_axes=(None, 0))(t, x)
        return -jnp.sum(weights * ll)

    return jax.grad(potential)(theta)


def potential(model: Model, rows: Rows) -> Callable:
    """``theta -> U(theta) = -sum_c sum_j log p(x_cj | theta) - log prior(theta)`` over packed
    ``rows`` (every client's real rows, the padding weighted 0; the prior once): the pooled
    potential, a reference for checks (the estimators ask each client instead,
    :mod:`fedmcmc.estimators.federation`)."""
    weights = row_weights(rows)

    def u(theta):
        ll = jax.vmap(model.log_likelihood, in_axes=(None, 0))(theta, rows.x)
        return -jnp.sum(weights * ll) - model.log_prior(theta)

    return u


def row_weights(rows: Rows, index=None):
    """``[R]``: 1 on the real rows of client ``index`` (of every client if None), 0 elsewhere."""
    owner = jnp.asarray(rows.row_client)
    return ((owner >= 0) if index is None else (owner == index)).astype(jnp.float32)


def bucket_rows(rows: Rows):
    """Each bucket of ``rows`` as ``(x, w, clients)``: its points ``[m, width, ...]``, their weights
    (1 on real rows, 0 on padding) ``[m, width]`` and its ``m`` clients (their indices)."""
    weights, order, row, first = row_weights(rows), jnp.asarray(rows.order), 0, 0
    for m, width in rows.buckets:
        xs = jax.tree_util.tree_map(lambda a: a[row:row + m * width].reshape((m, width) + a.shape[1:]), rows.x)
        yield xs, weights[row:row + m * width].reshape(m, width), order[first:first + m]
        row, first = row + m * width, first + m


def _client_buckets(model: Model, theta, theta_batched: bool, index, rows: Rows):
    """``grad U_i`` of the clients ``index`` (a batch), bucket by bucket: each bucket's clients
    at once on their own rows, at their ``theta`` (one for all if not ``theta_batched``; a
    client given twice must be given the same one)."""
    b = rows.num_clients
    order = jnp.asarray(rows.order)
    if theta_batched:
        per_client = jax.tree_util.tree_map(lambda t: jnp.zeros((b,) + t.shape[1:], t.dtype).at[index].set(t), theta)
    grads = []
    for xs, w, clients in bucket_rows(rows):
        if theta_batched:
            at = jax.tree_util.tree_map(lambda t: t[clients], per_client)
            grads.append(jax.vmap(partial(weighted_potential_grad, model))(at, xs, w))
        else:
            grads.append(jax.vmap(partial(weighted_potential_grad, model, theta))(xs, w))
    return _in_batch_order(grads, order, index)


def _in_batch_order(parts, order, index):
    """Per-client outputs computed bucket by bucket (``parts``, their clients in ``order``), in
    the order of the batch's client indices ``index``."""
    b = order.shape[0]
    position = jnp.zeros((b,), jnp.int32).at[order].set(jnp.arange(b, dtype=jnp.int32))
    return jax.tree_util.tree_map(lambda *g: jnp.concatenate(g)[position[index]], *parts)


def gradient_difference(model: Model, theta, anchor, x, weights):
    """``sum_j w_j [grad U_j(theta) - grad U_j(anchor)]`` on the same points (control variates)."""
    return weighted_potential_grad(model, theta, x, weights) - weighted_potential_grad(model, anchor, x, weights)


def local_gradient(model: Model, theta, client_data: ClientData):
    """The exact local gradient ``grad U_i(theta)``, reading the client's rows only.

    Alone, one gradient over the rows weighted by the client's mask. Under ``vmap`` over clients
    (the rows shared, :data:`fedmcmc.core.base.CLIENT_AXES`), every client's gradient at once,
    bucket by bucket (:func:`_client_buckets`): the work of one pass over the rows, not of one
    pass per client. Anywhere else (rows batched), the masked gradient per client.
    """
    def alone(theta, cd):
        return weighted_potential_grad(model, theta, cd.rows.x, row_weights(cd.rows, cd.index))

    @jax.custom_batching.custom_vmap
    def gradient(theta, cd):
        return alone(theta, cd)

    @gradient.def_vmap
    def batched(axis_size, in_batched, theta, cd):
        theta_b, cd_b = in_batched
        if cd_b.index and not any(jax.tree_util.tree_leaves(cd_b.rows)):
            return _client_buckets(model, theta, any(jax.tree_util.tree_leaves(theta_b)), cd.index, cd.rows), True
        axes = jax.tree_util.tree_map(lambda b: 0 if b else None, (theta_b, cd_b))
        return jax.vmap(alone, axes, axis_size=axis_size)(theta, cd), True

    return gradient(theta, client_data)


def resolve_batch_sizes(batch_size) -> np.ndarray | None:
    """Validate a batch size given as None (full batch), an int, or one int per client
    (indexed by client index, so it must have one entry per client)."""
    if batch_size is None:
        return None
    sizes = np.atleast_1d(np.asarray(batch_size))
    if sizes.ndim != 1 or not np.issubdtype(sizes.dtype, np.integer) or np.any(sizes < 1):
        raise ValueError(f"batch_size must be a positive integer or one per client (got {batch_size!r})")
    return sizes.astype(np.int32)


def prefix_uniforms(key, k: int, stream: int | None = None):
    """The first ``k`` of the ``stream`` (default ``k``) uniforms ``jax.random.uniform(key, (stream,))``.

    With JAX's default PRNG (threefry, partitionable: every value depends on its position only)
    they are ``jax.random.uniform(key, (k,))``, drawn as such; otherwise the stream is drawn and
    cut, so a minibatch drawn at a bucket's width (:func:`on_minibatch`) is the one drawn at the
    full width under any PRNG setting."""
    if stream is None or stream == k or (jax.config.jax_threefry_partitionable
                                         and jax.config.jax_default_prng_impl == "threefry2x32"):
        return jax.random.uniform(key, (k,))
    return jax.random.uniform(key, (stream,))[:k]


def subset_indices(key, count, n, k: int, stream: int | None = None):
    """A uniformly random ``n``-subset of ``{0, ..., count - 1}`` by Floyd's algorithm.

    Returns ``k >= n`` indices whose first ``n`` are the subset (distinct; in no particular
    order) and whose rest are 0; the first ``n`` depend only on the first ``n`` uniforms of the
    ``stream`` (default ``k``) of ``key`` (:func:`prefix_uniforms`). Floyd (Bentley and Floyd,
    CACM 1987): for
    ``t = 0, ..., n - 1`` with ``j_t = count - n + t``, draw ``r_t`` uniform in ``{0, ..., j_t}``
    and choose ``c_t = r_t``, or ``j_t`` if ``r_t`` was already chosen. Every subset has
    probability ``1 / binom(count, n)``, from ``k`` uniforms instead of ``count`` sort keys.

    Whether step ``t`` collides depends on the earlier steps only through which of them
    collided: ``r_t`` was chosen before iff some ``s < t`` has ``r_t = r_s`` and no collision
    at ``s``, or ``r_t = j_s`` and a collision at ``s`` (only ``s = r_t - j_0`` can match). The
    comparisons are made at once (``O(k^2)``, vectorised); what stays sequential is a chain
    of bit operations, which XLA
    fuses into one kernel for ``k <= 24`` (bitmasks in a uint32). For larger ``k`` the same
    rule is solved as a fixed point, all ``t`` at once: iterating from "no collision" fixes
    step ``m`` after ``m`` iterations and stops at the unique fixed point, Floyd's output,
    usually within a few iterations. The ``O(k^2)`` comparison is made once, into each step's
    latest earlier step with the same ``r``; an iteration then follows those lists in ``O(k)``
    (values at ``t`` depend only on values before ``t``, so the joint fixed point is reached as
    above, and at it the lists give the comparison's answer).
    """
    u = prefix_uniforms(key, k, stream)
    t = jnp.arange(k, dtype=jnp.int32)
    j = jnp.asarray(count, jnp.int32) - jnp.asarray(n, jnp.int32) + t
    r = materialize(jnp.minimum((u * (j + 1).astype(jnp.float32)).astype(jnp.int32), j))
    earlier = t[None, :] < t[:, None]  # [t, s]: s < t
    same_r = (r[:, None] == r[None, :]) & earlier
    # r_t = j_s for at most one s, s = r_t - j_0, and it counts only if 0 <= s < t
    s_of_r = r - j[0]
    hits_j = (s_of_r >= 0) & (s_of_r < t)
    if k <= 24:
        bit = jnp.left_shift(jnp.uint32(1), t.astype(jnp.uint32))
        zero = jnp.uint32(0)
        mask_r = jnp.sum(jnp.where(same_r, bit[None, :], zero), axis=1, dtype=jnp.uint32)
        mask_j = jnp.where(hits_j, jnp.left_shift(jnp.uint32(1), jnp.clip(s_of_r, 0, 31).astype(jnp.uint32)), zero)
        hits = jnp.uint32(0)
        for s in range(k):
            hit = ((mask_r[s] & ~hits) | (mask_j[s] & hits)) != 0
            hits = hits | jnp.left_shift(hit.astype(jnp.uint32), jnp.uint32(s))
        collided = (jnp.right_shift(hits, t.astype(jnp.uint32)) & 1) == 1
    else:
        # the steps s < t with r_s = r_t, as a list through prev[t] = the latest of them (-1: none):
        # "some s < t has r_s = r_t and no collision" is free[t] = ~collided[prev] | free[prev]
        prev = jnp.max(jnp.where(same_r, t[None, :], -1), axis=1)
        p, has, q = jnp.maximum(prev, 0), prev >= 0, jnp.clip(s_of_r, 0, k - 1)

        def step(state):
            collided, free, _ = state
            free_new = has & (~collided[p] | free[p])
            new = free_new | (hits_j & collided[q])
            return new, free_new, jnp.any(new != collided) | jnp.any(free_new != free)

        none = jnp.zeros((k,), bool)
        collided, _, _ = jax.lax.while_loop(lambda state: state[2], step, (none, none, jnp.asarray(True)))
    return materialize(jnp.where(t < n, jnp.where(collided, j, r), 0))


#: Top-k draws a batch of k rows out of n_max when k^2 > TOP_K_RATIO n_max (the measured break-even).
TOP_K_RATIO = 60


def top_k_indices(key, count, n, k: int, n_max: int):
    """A uniformly random ``n``-subset of ``{0, ..., count - 1}`` (``count <= n_max``): the rows
    of the ``k`` largest of ``n_max`` uniform keys, padding rows keyed below every real one.

    Returns ``k >= n`` indices whose first ``n`` are the subset (the ``n`` largest keys among
    the real rows, a uniform ``n``-subset by exchangeability) and whose rest are 0.
    """
    u = jax.random.uniform(key, (n_max,))
    keys = jnp.where(jnp.arange(n_max) < count, u, -1.0)
    idx = jax.lax.top_k(keys, k)[1].astype(jnp.int32)
    return jnp.where(jnp.arange(k) < n, idx, 0)


def minibatch(key, client_data: ClientData, batch_sizes: np.ndarray, width: int | None = None):
    """Draw client ``i``'s minibatch of ``n_i = min(batch_size_i, N_i)`` points without replacement.

    Returns the gathered rows (``[width, ...]``; default ``k = max(batch_sizes)``, at most
    ``n_max``) and their weights ``N_i / n_i`` (zero on the rows beyond ``n_i``), so that
    ``sum_j w_j grad U_ij`` is unbiased for ``grad U_i``. The subset does not depend on
    ``width >= n_i``: the method (Floyd or top-k) and the uniforms are those of width ``k``.
    """
    rows, count = client_data.rows, client_data.count
    n_max = rows.n_max
    k = int(min(int(batch_sizes.max()), n_max))
    width = k if width is None else width
    size = jnp.asarray(batch_sizes)[client_data.index] if batch_sizes.size > 1 else jnp.asarray(batch_sizes[0])
    n = jnp.minimum(size, count)
    if k * k > TOP_K_RATIO * n_max:
        idx = top_k_indices(key, count, n, width, n_max)
    else:
        idx = subset_indices(key, count, n, width, k)
    w = jnp.where(jnp.arange(width) < n, count.astype(jnp.float32) / n.astype(jnp.float32), 0.0)
    at = materialize(client_data.start + idx)  # the same gather whether start is a constant or not
    xb = jax.tree_util.tree_map(lambda a: jnp.asarray(a)[at], rows.x)
    return xb, w


#: What one more bucket of batch sizes costs (:func:`on_minibatch`), in minibatch rows of a round:
#: its kernels' start-up at run time, a few rows, plus its compilation amortised over 10^6
#: chain-rounds (30 chains of 33,000 rounds; QLSD's toy runs are 500,000 rounds a chain):
#: ``MINIBATCH_COMPILE_ROWS / d``. Measured on the toy problem (QLSD*, d = 50): a bucket took
#: about 1.1 CPU-s to compile, and a minibatch row about 1.2 ns of CPU a dimension and
#: chain-round (docs/design.md, "Minibatch buckets").
MINIBATCH_BUCKET_ROWS = 4
MINIBATCH_COMPILE_ROWS = 900


def minibatch_buckets(batch_sizes: np.ndarray, dim: int) -> tuple:
    """The clients' buckets of batch size for a model of dimension ``dim`` (:func:`on_minibatch`):
    :func:`fedmcmc.data.federated.buckets` of the sizes at ``MINIBATCH_BUCKET_ROWS +
    MINIBATCH_COMPILE_ROWS / dim`` rows a bucket; one bucket for a single size."""
    sizes = np.asarray(batch_sizes)
    if sizes.size == 1:
        return ((0,),)
    return buckets(sizes, MINIBATCH_BUCKET_ROWS + MINIBATCH_COMPILE_ROWS / dim)


def on_minibatch(batch_sizes: np.ndarray, estimate: Callable, dim: int):
    """An estimate on each client's minibatch, clients grouped by batch size under ``vmap``.

    Parameters
    ----------
    batch_sizes
        ``[b]`` (or ``[1]``) batch sizes, as :func:`resolve_batch_sizes` gives them.
    estimate
        ``estimate(*args, xb, w)`` of the gathered rows and their weights (:func:`minibatch`),
        for example :func:`weighted_potential_grad`'s ``sum_j w_j grad U_ij(theta)``.
    dim
        The model's dimension ``d``: a row costs about ``d`` (``MINIBATCH_COMPILE_ROWS``).

    Returns
    -------
    ``f(key, client_data, *args) = estimate(*args, *minibatch(key, client_data, batch_sizes))``.

    Notes
    -----
    One client alone draws ``k = max_i batch_size_i`` rows, those beyond its ``n_i`` weighted
    0. Clients' batch sizes may differ (QLSD's toy problem: a tenth of each client's points, 1
    to 19), and under ``vmap`` over ``b`` entries with every client's index (the rows shared,
    :data:`fedmcmc.core.base.CLIENT_AXES`: the simulator's round, each client once; a Flower
    node's exact mode, ``b`` copies of its client) the clients are cut into buckets of similar
    batch size (:func:`minibatch_buckets`), each drawing its largest client's rows: the
    work of ``sum_k m_k w_k`` rows, not ``b k`` (docs/design.md, "Minibatch buckets"). Each client's subset and weights are the ones
    it draws alone (a bucket's draw is a prefix of the full one, :func:`minibatch`); a sum over
    fewer rows may round differently in the last bit. Entries with the same index must carry
    the same inputs. Under any other ``vmap`` (some of the clients) every client draws ``k`` rows.
    """
    sizes = np.asarray(batch_sizes)
    groups = minibatch_buckets(sizes, dim)

    def alone(width, key, client_data, args):
        xb, w = minibatch(key, client_data, sizes, width)
        return estimate(*args, xb, w)

    @jax.custom_batching.custom_vmap
    def run(key, client_data, args):
        return alone(None, key, client_data, args)

    @run.def_vmap
    def batched(axis_size, in_batched, key, client_data, args):
        leaves, tree = jax.tree_util.tree_flatten((key, client_data, args))
        flags = jax.tree_util.tree_leaves(in_batched)
        axes = jax.tree_util.tree_unflatten(tree, [0 if f else None for f in flags])
        cd_flags = in_batched[1]
        if len(groups) == 1 or axis_size != sizes.size or any(jax.tree_util.tree_leaves(cd_flags.rows)) \
                or not cd_flags.index:
            return jax.vmap(partial(alone, None), axes, axis_size=axis_size)(key, client_data, args), True
        b = axis_size
        # the position in the batch of each client, then each bucket's clients' inputs
        position = jnp.zeros((b,), jnp.int32).at[client_data.index].set(jnp.arange(b, dtype=jnp.int32))
        outs = []
        for group in groups:
            at = position[np.asarray(group)]
            part = jax.tree_util.tree_unflatten(tree, [x[at] if f else x for x, f in zip(leaves, flags)])
            width = int(min(sizes[list(group)].max(), client_data.rows.n_max))
            outs.append(jax.vmap(partial(alone, width), axes)(*part))
        order = jnp.asarray(np.concatenate([np.asarray(g) for g in groups]), jnp.int32)
        return _in_batch_order(outs, order, client_data.index), True

    def call(key, client_data, *args):
        return run(key, client_data, args)

    return call


def minibatch_gradient(model: Model, batch_size=None) -> Oracle:
    """``H_i(theta) = (N_i / n_i) sum_{j in S_i} grad U_ij(theta)`` (QLSD#); the exact local
    gradient when ``batch_size`` is None."""
    sizes = resolve_batch_sizes(batch_size)

    on_batch = None if sizes is None else on_minibatch(sizes, partial(weighted_potential_grad, model), model.dim)

    def oracle(key, theta, client_data):
        if sizes is None:
            return local_gradient(model, theta, client_data)
        return on_batch(key, client_data, theta)

    return oracle


def control_variate_gradient(model: Model, theta_star, batch_size=None) -> Oracle:
    """``H*_i(theta) = (N_i / n_i) sum_{j in S_i} [grad U_ij(theta) - grad U_ij(theta*)]`` (QLSD*).

    Its mean is ``grad U_i(theta) - grad U_i(theta*)``; the server adds the constant
    ``sum_i grad U_i(theta*)`` once (see :func:`find_mode`).
    """
    sizes = resolve_batch_sizes(batch_size)
    theta_star = jnp.asarray(theta_star, jnp.float32)

    on_batch = None if sizes is None else on_minibatch(sizes, partial(gradient_difference, model), model.dim)

    def oracle(key, theta, client_data):
        if sizes is None:
            return local_gradient(model, theta, client_data) - local_gradient(model, theta_star, client_data)
        return on_batch(key, client_data, theta, theta_star)

    return oracle


class ModeResult(NamedTuple):
    """The mode theta* = argmin U of the posterior potential, and what finding it cost.

    Attributes
    ----------
    theta
        theta*.
    client_grad_sum
        ``sum_i grad U_i(theta*)`` (equal to ``-grad log prior(theta*)`` at an exact mode).
    gradient_norm
        ``||grad U(theta*)||``, prior included: how exact the mode is.
    rounds
        Federated rounds used: each is one full local gradient per client.
    bits
        Bits exchanged to find it: ``rounds * b * 32 d`` up plus as many down.
    client_grads
        ``[b, d]``: each client's ``grad U_i(theta*)``, the uploads of the round at theta*
        (:func:`heterogeneity`), or None where not kept.
    """

    theta: Any
    client_grad_sum: Any
    gradient_norm: float
    rounds: int
    bits: int
    client_grads: Any = None


def heterogeneity(mode: ModeResult, cov=None) -> dict | None:
    """The clients' heterogeneity at the mode (Vono et al. 2022, Section 3), from the gradients
    the mode's last round uploads: ``b_star = sum_i ||grad U_i(theta*)||^2``, the ``B*`` of their
    assumption H3 and Tables 1-2, and, with the posterior covariance ``cov`` (``H^{-1}`` of the
    Laplace approximation, or its diagonal ``[d]``), ``b_star_in_sds = sum_i g_i' H^{-1} g_i``:
    how far, in posterior standard deviations squared, each client's own data pull away from the
    consensus, summed. QLSD#'s bias from compression and partial participation grows with ``B*``
    (``omega B*`` in Table 2); QLSD*'s control variates at the mode and QLSD++'s memory terms
    remove it. None where the gradients were not kept."""
    if mode.client_grads is None:
        return None
    g = np.asarray(mode.client_grads, np.float64)
    out = {"b_star": float(np.sum(g * g)), "b_star_in_sds": None,
           "max_client_in_sds": None, "clients": int(g.shape[0])}
    if cov is not None:
        cov = np.asarray(cov, np.float64)
        pulls = np.einsum("id,de,ie->i", g, cov, g) if cov.ndim == 2 else np.sum(g * g * cov, axis=1)
        out.update(b_star_in_sds=float(np.sum(pulls)), max_client_in_sds=float(np.sqrt(np.max(pulls))))
    return out


#: Up to this many parameters a client can upload its full Hessian (the mode's Newton steps, the
#: Laplace approximation's covariance); beyond, only what is linear in the dimension.
FULL_HESSIAN_DIM = 200
#: Newton's steps stop when the Newton decrement ``g' H^{-1} g`` (the squared distance to the
#: mode in posterior standard deviations, under the Gaussian approximation) is below this.
NEWTON_TOL = 1e-8
#: Below this decrement Newton's full steps are taken without a trial round (Boyd and Vandenberghe,
#: Convex Optimization, Section 9.5: the quadratically convergent phase).
NEWTON_FULL_STEP = 0.1


def find_mode(model: Model, data, theta0=None, max_rounds: int = 500, tol: float = 1e-4) -> ModeResult:
    """Find theta* by federated rounds and report their communication cost.

    ``data`` is a :class:`~fedmcmc.data.federated.FederatedData` or a
    :class:`~fedmcmc.estimators.federation.Federation` (a Flower run's clients): the search runs
    on the server, in float64, on the clients' answers summed in client order plus the prior's
    terms, so that it finds the same point, bit for bit, in the simulator and over Flower.

    Up to ``FULL_HESSIAN_DIM`` parameters, damped Newton's steps from ``theta0`` (zeros if None;
    :func:`_newton`): each round every client returns its value, gradient and Hessian, and a few
    rounds reach the mode whatever the parametrisation's scales and correlations. Beyond, L-BFGS
    (``scipy.optimize``, ``gtol = tol`` on the potential per point): each round every client
    returns its value and gradient (``32 (1 + d)`` bits up, theta's ``32 d`` down). The last
    round's gradients are the clients' ``grad U_i(theta*)`` (:attr:`ModeResult.client_grads`).
    """
    from fedmcmc.estimators.federation import federation

    fed = federation(model, data)
    d, b = int(model.dim), fed.num_clients
    theta = np.zeros(d, np.float32) if theta0 is None else np.asarray(theta0, np.float32)
    prior = jax.jit(lambda t: (-model.log_prior(t), -jax.grad(model.log_prior)(t)))
    if d <= FULL_HESSIAN_DIM:
        theta, rounds, bits, last = _newton(fed, model, theta, max_rounds)
    else:
        theta, rounds, bits, last = _lbfgs(fed, prior, theta, max_rounds, tol, max(int(np.sum(fed.counts)), 1))
    if last is None or not np.array_equal(last[0], theta):  # the clients' gradients at theta*: one more round
        last = (theta, fed.ask("value_grad", theta)[1])
        rounds, bits = rounds + 1, bits + b * 32 * (1 + 2 * d)
    grads = np.asarray(last[1], np.float64)
    client_sum = np.sum(grads, axis=0)
    if not (np.all(np.isfinite(theta)) and np.all(np.isfinite(client_sum))):
        raise ValueError("the search for the federated mode (Newton, or L-BFGS) reached NaN or inf: the log-likelihood or prior "
                         "overflows on the way; standardise the features (and a regression's response) or "
                         "parametrise the model so that theta = 0 is a sensible start")
    grad_norm = float(np.linalg.norm(client_sum + np.asarray(prior(theta)[1], np.float64)))
    return ModeResult(jnp.asarray(theta), jnp.asarray(client_sum, jnp.float32), grad_norm, rounds, bits,
                      grads.astype(np.float32))


def _summed(answers, prior_part) -> np.ndarray:
    """The clients' answers (leading client axis) summed in client order, plus the prior's part, in float64."""
    return np.sum(np.asarray(answers, np.float64), axis=0) + np.asarray(prior_part, np.float64)


def _newton(fed, model: Model, theta, max_rounds: int) -> tuple[np.ndarray, int, int, tuple | None]:
    """Damped Newton's method on ``U`` from ``theta``: ``(theta, rounds, bits, (theta, client gradients)
    of the last Newton round)``.

    A round returns each client's value, gradient and Hessian (``32 (1 + d + d (d + 1) / 2)`` bits
    up, ``theta`` down); the server adds the prior's and solves in float64 with the Hessian's
    eigenvalues made positive, ``H+ = V |Lambda| V'`` (a descent direction where ``H`` is indefinite,
    away from the mode), and halves the step until ``U`` decreases (each trial a round of values).
    Once the Newton decrement ``g' H^{-1} g`` (the squared distance to the mode in posterior sds)
    is below :data:`NEWTON_FULL_STEP` with ``H`` positive definite, it takes full steps without a
    trial (the quadratic region, where they converge quadratically). It stops when the decrement
    falls below :data:`NEWTON_TOL`, when a full step does not decrease it or no halving decreases
    ``U`` (float32's resolution is reached), or after ``max_rounds``.
    """
    d, b = int(np.shape(theta)[0]), fed.num_clients
    prior = jax.jit(lambda t: (-model.log_prior(t), -jax.grad(model.log_prior)(t), -jax.hessian(model.log_prior)(t)))
    prior_value = jax.jit(lambda t: -model.log_prior(t))
    newton_bits, value_bits = b * 32 * (1 + 2 * d + d * (d + 1) // 2), b * 32 * (1 + d)
    rounds, bits, last, previous = 0, 0, None, None
    while rounds < max_rounds:
        values, grads, hessians = fed.ask("newton", theta)
        p_value, p_grad, p_hessian = prior(theta)
        value, g, h = _summed(values, p_value), _summed(grads, p_grad), _summed(hessians, p_hessian)
        rounds, bits, last = rounds + 1, bits + newton_bits, (theta, grads)
        if not (np.isfinite(value) and np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
            break
        lam, vec = np.linalg.eigh(0.5 * (h + h.T))
        size = np.maximum(np.abs(lam), 1e-12 * np.max(np.abs(lam)))
        step = vec @ ((vec.T @ g) / size)
        decrement = float(g @ step)
        if lam.min() > 0 and decrement < NEWTON_TOL:
            break
        if lam.min() > 0 and decrement < NEWTON_FULL_STEP:  # within the quadratic region: full steps, no trial
            if previous is not None and decrement >= previous:
                break  # no progress: float32's resolution of the gradients is reached
            theta, previous = (np.asarray(theta, np.float64) - step).astype(np.float32), decrement
            continue
        previous, t, moved = None, 1.0, False
        while rounds < max_rounds and t > 1e-6:
            trial = (np.asarray(theta, np.float64) - t * step).astype(np.float32)
            trial_value = _summed(fed.ask("value", trial), prior_value(trial))
            rounds, bits = rounds + 1, bits + value_bits
            if trial_value < value:
                theta, moved = trial, True
                break
            t /= 2
        if not moved:
            break
    return theta, rounds, bits, last


def _lbfgs(fed, prior: Callable, theta, max_rounds: int, tol: float, total: int):
    """L-BFGS on ``U / total`` from ``theta`` (scipy's L-BFGS-B without bounds), one round per
    evaluation: ``(theta, rounds, bits, (theta, client gradients) of the last round)``."""
    from scipy.optimize import minimize

    d, b, last = int(np.shape(theta)[0]), fed.num_clients, [None]

    def objective(x):
        t = np.asarray(x, np.float32)
        values, grads = fed.ask("value_grad", t)
        p_value, p_grad = prior(t)
        last[0] = (t, grads)
        value, g = _summed(values, p_value), _summed(grads, p_grad)
        if not (np.isfinite(value) and np.all(np.isfinite(g))):
            return np.inf, np.zeros(d)
        return value / total, g / total

    res = minimize(objective, np.asarray(theta, np.float64), jac=True, method="L-BFGS-B",
                   options={"maxfun": max_rounds, "maxiter": max_rounds, "gtol": tol, "ftol": 1e-12})
    rounds = int(res.nfev)
    return np.asarray(res.x, np.float32), rounds, rounds * b * 32 * (1 + 2 * d), last[0]
