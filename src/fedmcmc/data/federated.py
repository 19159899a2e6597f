"""Per-client data packed by size: memory and full-batch work scale with the points.

All clients' points sit in one array pytree (:class:`fedmcmc.core.base.Rows`). Clients of similar
sizes form a bucket, padded to its largest client: a full-batch round reads ``sum_k m_k w_k``
rows (``m_k`` clients of width ``w_k``), never ``b * max_i N_i``. The buckets are chosen by
:func:`buckets` to minimise the rows read plus a measured cost per bucket. A client's gradient
is computed bucket by bucket (:func:`fedmcmc.estimators.gradients.local_gradient`); a minibatch
gathers rows from the client's own ``start`` (docs/design.md, "Packed data").
"""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import ClientData, Rows

#: What one more bucket costs, in rows read by a full-batch round: 16 rows for its gradient
#: kernels at run time (measured on the toy problem) plus 48 for compiling them, about 0.15 s
#: per gradient in a program, paid back by 48 rows over about 10^5 chain-rounds of the toy
#: problem (docs/design.md, "Packed buckets").
BUCKET_ROWS = 64
#: At most this many buckets: each is one more gradient in every compiled program (6 keep the
#: toy problem at 1.06 rows a point; docs/design.md, "Packed buckets").
MAX_BUCKETS = 6


def buckets(counts, bucket_rows: float = BUCKET_ROWS, max_buckets: int = MAX_BUCKETS) -> tuple:
    """Clients grouped by size: the grouping of the clients sorted by size into at most
    ``max_buckets`` runs that minimises ``sum_k m_k w_k + bucket_rows * K`` (dynamic
    programming), smallest clients first. Returns one tuple of client indices per bucket."""
    counts = np.asarray(counts, np.int64)
    order = np.argsort(counts, kind="stable")
    size = counts[order].astype(np.float64)
    b = size.size
    # cost[k, j]: the best grouping of the j smallest clients in k buckets
    cost = np.full((max_buckets + 1, b + 1), np.inf)
    cut = np.zeros((max_buckets + 1, b + 1), np.int64)
    cost[0, 0] = 0.0
    starts = np.arange(b)
    for k in range(1, max_buckets + 1):
        for j in range(1, b + 1):
            total = cost[k - 1, :j] + (j - starts[:j]) * size[j - 1]
            cut[k, j] = int(np.argmin(total))
            cost[k, j] = total[cut[k, j]] + bucket_rows
    k = int(np.argmin(cost[1:, b])) + 1
    groups, j = [], b
    while k > 0:
        i = cut[k, j]
        groups.append(tuple(int(c) for c in order[i:j]))
        j, k = i, k - 1
    return tuple(reversed(groups))


class FederatedData(NamedTuple):
    """Data of ``b`` clients, packed by bucket.

    Attributes
    ----------
    x
        Pytree of arrays with leading axis ``R`` (:class:`fedmcmc.core.base.Rows`): client ``i``'s
        points are rows ``starts[i] .. starts[i] + counts[i] - 1``.
    counts
        Number of real data points per client, ``N_i`` (int32, shape ``[b]``).
    groups
        The clients of each bucket, in the order of their rows (:func:`buckets`).
    """

    x: Any
    counts: Any
    groups: tuple

    @property
    def num_clients(self) -> int:
        return int(np.shape(self.counts)[0])

    @property
    def n_max(self) -> int:
        return int(np.max(np.asarray(self.counts)))

    @property
    def total(self) -> int:
        return int(np.sum(np.asarray(self.counts)))

    @property
    def weights(self) -> np.ndarray:
        """``w_c = n_c / n``, the clients' shares of the data (float64, sums to 1)."""
        counts = np.asarray(self.counts, np.float64)
        return counts / counts.sum()

    @property
    def widths(self) -> list[int]:
        """The rows of each client of a bucket: its largest client's points."""
        counts = np.asarray(self.counts)
        return [int(counts[list(g)].max()) for g in self.groups]

    @property
    def starts(self) -> np.ndarray:
        """The first row of each client (int32)."""
        starts, row = np.zeros(self.num_clients, np.int32), 0
        for group, width in zip(self.groups, self.widths):
            starts[list(group)] = row + width * np.arange(len(group))
            row += width * len(group)
        return starts

    def rows(self) -> Rows:
        """All clients' rows, with which row belongs to which client."""
        counts, widths = np.asarray(self.counts), self.widths
        owner = np.concatenate([np.repeat(np.asarray(g), w) for g, w in zip(self.groups, widths)])
        within = np.concatenate([np.tile(np.arange(w), len(g)) for g, w in zip(self.groups, widths)])
        row_client = np.where(within < counts[owner], owner, -1).astype(np.int32)
        order = np.asarray([c for g in self.groups for c in g], np.int32)
        return Rows(self.x, row_client, order, tuple((len(g), w) for g, w in zip(self.groups, widths)), self.n_max)

    def client(self, i: int) -> ClientData:
        """The data client ``i`` holds, as it sees it."""
        return ClientData(self.rows(), jnp.asarray(self.counts[i], jnp.int32), jnp.asarray(i, jnp.int32),
                          jnp.asarray(self.starts[i], jnp.int32))

    def clients(self) -> ClientData:
        """All clients' data, one count, index and start per client (the input of ``vmap``
        with :data:`fedmcmc.core.base.CLIENT_AXES`)."""
        return ClientData(self.rows(), jnp.asarray(self.counts, jnp.int32),
                          jnp.arange(self.num_clients, dtype=jnp.int32), jnp.asarray(self.starts))

    def unpadded(self, i: int) -> Any:
        """Client ``i``'s real data points (numpy)."""
        start, n = int(self.starts[i]), int(np.asarray(self.counts)[i])
        return jax.tree_util.tree_map(lambda a: np.asarray(a[start:start + n]), self.x)

    def pooled(self) -> "FederatedData":
        """All data points in one client: the centralised problem."""
        parts = [self.unpadded(i) for i in range(self.num_clients)]
        x = jax.tree_util.tree_map(lambda *a: np.concatenate(a, axis=0), *parts)
        return from_clients([x])


def _check(clients: Sequence[Any]) -> list[int]:
    """The clients' numbers of points, after checking that they fit together."""
    if len(clients) == 0:
        raise ValueError("federated data needs at least one client (got an empty list)")
    treedef = jax.tree_util.tree_structure(clients[0])
    counts = []
    for i, c in enumerate(clients):
        if jax.tree_util.tree_structure(c) != treedef:
            raise ValueError(f"client {i} has a different data structure from client 0")
        lens = {np.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(c)}
        if len(lens) != 1:
            raise ValueError(f"client {i}: arrays have different numbers of rows {sorted(lens)}")
        n = lens.pop()
        if n == 0:
            raise ValueError(f"client {i} holds no data; drop it or give it at least one point")
        counts.append(n)
    return counts


def from_clients(clients: Sequence[Any], dtype=np.float32, groups: tuple | None = None) -> FederatedData:
    """Build :class:`FederatedData` from a list of per-client pytrees of arrays.

    Parameters
    ----------
    clients
        One pytree per client; every leaf has the client's data points on axis 0, and
        all clients have the same tree structure and trailing shapes.
    dtype
        Float leaves are cast to this dtype; integer leaves (labels) are kept.
    groups
        The buckets (default :func:`buckets` of the clients' sizes).
    """
    counts = np.asarray(_check(clients), np.int32)
    data = FederatedData(None, counts, buckets(counts) if groups is None else _checked(groups, counts.size))
    starts, rows = data.starts, _num_rows(data)

    def pack(*leaves):
        first = np.asarray(leaves[0])
        out_dtype = dtype if np.issubdtype(first.dtype, np.floating) else first.dtype
        out = np.zeros((rows,) + first.shape[1:], dtype=out_dtype)
        for i, leaf in enumerate(leaves):
            leaf = np.asarray(leaf)
            if leaf.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"client {i}: data points have shape {leaf.shape[1:]}, client 0 has {first.shape[1:]}"
                )
            with np.errstate(over="ignore"):  # a value too large for float32 is named below
                out[starts[i]:starts[i] + leaf.shape[0]] = leaf
            bad = ~np.isfinite(out[starts[i]:starts[i] + leaf.shape[0]].reshape(leaf.shape[0], -1)).all(axis=1)
            if bad.any():
                raise ValueError(f"client {i}: data point {int(np.argmax(bad))} holds NaN or inf (as {out.dtype}); "
                                 "drop or fix such points (or rescale values too large for float32)")
        return out

    return data._replace(x=jax.tree_util.tree_map(pack, *clients))


def _checked(groups, b: int) -> tuple:
    groups = tuple(tuple(int(c) for c in g) for g in groups)
    if sorted(c for g in groups for c in g) != list(range(b)) or not all(groups):
        raise ValueError(f"groups must split the clients 0..{b - 1} into non-empty buckets (got {groups!r})")
    return groups


def _num_rows(data: FederatedData) -> int:
    return int(sum(len(g) * w for g, w in zip(data.groups, data.widths)))


def zeros(counts, like: Any) -> FederatedData:
    """:class:`FederatedData` of clients with these numbers of points, all zeros, whose points
    have the shapes and dtypes of ``like`` (a pytree of arrays of one point each)."""
    counts = np.asarray(counts, np.int32)
    data = FederatedData(None, counts, buckets(counts))
    rows = _num_rows(data)
    return data._replace(x=jax.tree_util.tree_map(lambda a: np.zeros((rows,) + np.shape(a), np.asarray(a).dtype),
                                                  like))
