"""Per-client data as one padded array pytree, so clients can be vectorised."""

from __future__ import annotations

from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import ClientData


class FederatedData(NamedTuple):
    """Data of ``b`` clients, padded to a common length ``n_max``.

    Attributes
    ----------
    x
        Pytree of arrays with leading axes ``[b, n_max, ...]``; rows ``>= counts[i]`` of
        client ``i`` are padding (zeros) and never enter a gradient.
    counts
        Number of real data points per client, ``N_i`` (int32, shape ``[b]``).
    """

    x: Any
    counts: Any

    @property
    def num_clients(self) -> int:
        return int(np.shape(self.counts)[0])

    @property
    def n_max(self) -> int:
        return int(jax.tree_util.tree_leaves(self.x)[0].shape[1])

    @property
    def total(self) -> int:
        return int(np.sum(np.asarray(self.counts)))

    @property
    def weights(self) -> np.ndarray:
        """``w_c = n_c / n``, the clients' shares of the data (float64, sums to 1)."""
        counts = np.asarray(self.counts, np.float64)
        return counts / counts.sum()

    def client(self, i: int) -> ClientData:
        """The data client ``i`` holds, as it sees it."""
        return ClientData(
            x=jax.tree_util.tree_map(lambda a: a[i], self.x),
            count=jnp.asarray(self.counts)[i],
            index=jnp.asarray(i, jnp.int32),
        )

    def clients(self) -> ClientData:
        """All clients' data with a leading client axis (the input of ``vmap``)."""
        return ClientData(
            x=self.x,
            count=jnp.asarray(self.counts, jnp.int32),
            index=jnp.arange(self.num_clients, dtype=jnp.int32),
        )

    def unpadded(self, i: int) -> Any:
        """Client ``i``'s real data points, without padding (numpy)."""
        n = int(np.asarray(self.counts)[i])
        return jax.tree_util.tree_map(lambda a: np.asarray(a[i, :n]), self.x)

    def pooled(self) -> "FederatedData":
        """All data points in one client: the centralised problem."""
        parts = [self.unpadded(i) for i in range(self.num_clients)]
        x = jax.tree_util.tree_map(lambda *a: np.concatenate(a, axis=0), *parts)
        return from_clients([x])


def from_clients(clients: Sequence[Any], dtype=np.float32) -> FederatedData:
    """Build :class:`FederatedData` from a list of per-client pytrees of arrays.

    Parameters
    ----------
    clients
        One pytree per client; every leaf has the client's data points on axis 0, and
        all clients have the same tree structure and trailing shapes.
    dtype
        Float leaves are cast to this dtype; integer leaves (labels) are kept.
    """
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
    n_max = max(counts)

    def pad(*leaves):
        first = np.asarray(leaves[0])
        out_dtype = dtype if np.issubdtype(first.dtype, np.floating) else first.dtype
        out = np.zeros((len(leaves), n_max) + first.shape[1:], dtype=out_dtype)
        for i, leaf in enumerate(leaves):
            leaf = np.asarray(leaf)
            if leaf.shape[1:] != first.shape[1:]:
                raise ValueError(
                    f"client {i}: data points have shape {leaf.shape[1:]}, client 0 has {first.shape[1:]}"
                )
            out[i, : leaf.shape[0]] = leaf
        return out

    x = jax.tree_util.tree_map(pad, *clients)
    return FederatedData(x=x, counts=np.asarray(counts, dtype=np.int32))
