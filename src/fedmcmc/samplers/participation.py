"""Partial participation: which clients upload in a round, and how the server weighs them.

Two aggregations of the uploads ``g_i`` of the active set ``A_k`` (Vono et al., AISTATS 2022):

* ``scaling="active"`` (Algorithm 1): ``(b / |A_k|) sum_{i in A_k} g_i``;
* ``scaling="inverse_probability"`` (supplement, eq. S3): ``sum_{i in A_k} g_i / p_i``, which is
  unbiased for ``sum_i g_i`` whatever the ``p_i``.

A round with no active client is defined, never a division by zero:

* under ``"inverse_probability"`` the likelihood term is the empty sum, zero, and the server
  still takes its prior and noise step: this is what unbiasedness requires;
* under ``"active"`` the chain pauses (the server keeps theta and moves on): conditionally
  on a non-empty round the estimator is unbiased for equal ``p_i``, and pausing is only a
  change of clock, so the stationary law is unchanged.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks
from fedmcmc.core.base import Participation

SCALINGS = ("active", "inverse_probability")


def full() -> Participation:
    """Every client, every round (weights 1)."""

    def sample(key, num_clients):
        del key
        return jnp.ones((num_clients,), bool)

    def weights(mask):
        return mask.astype(jnp.float32)

    return Participation(sample, weights, pause_when_empty=False, name="full", probs=1.0)


def bernoulli(probs: float | Sequence[float], scaling: str = "active") -> Participation:
    """Client ``i`` is active with probability ``p_i``, independently across clients and rounds.

    Parameters
    ----------
    probs
        One probability for all clients or one per client, each in (0, 1].
    scaling
        ``"active"`` for ``b / |A_k|`` or ``"inverse_probability"`` for ``1 / p_i``.
    """
    p = np.atleast_1d(np.asarray(probs, dtype=np.float64))
    if p.ndim != 1 or not np.all(np.isfinite(p)) or np.any(p <= 0) or np.any(p > 1):
        raise ValueError(
            f"participation probabilities must lie in (0, 1] (got {np.asarray(probs).tolist()}); "
            "use 1.0 for full participation"
        )
    checks.choice("participation scaling", scaling, SCALINGS)
    p32 = jnp.asarray(p, jnp.float32)

    def sample(key, num_clients):
        probs_b = jnp.broadcast_to(p32, (num_clients,))
        return jax.random.uniform(key, (num_clients,)) < probs_b

    if scaling == "active":
        def weights(mask):
            m = mask.astype(jnp.float32)
            n_active = jnp.sum(m)
            return m * (mask.shape[0] / jnp.maximum(n_active, 1.0))
    else:
        def weights(mask):
            return mask.astype(jnp.float32) / jnp.broadcast_to(p32, mask.shape)

    label = f"bernoulli(p={p.tolist() if p.size > 1 else float(p[0])}, {scaling})"
    return Participation(sample, weights, pause_when_empty=(scaling == "active"), name=label,
                         num_clients=p.size if p.size > 1 else None,
                         probs=tuple(p.tolist()) if p.size > 1 else float(p[0]))


def categorical(probs: Sequence[float]) -> Participation:
    """Exactly one client per round, client ``s`` with probability ``f_s`` (weight 1).

    The shard schedule of distributed SGLD (Ahn et al. 2014; El Mekkaoui et al. 2021): a chain
    visits one shard at a time. ``max_active = 1`` lets the simulator run only that client.
    """
    f = checks.per_client("shard probabilities", probs, sums_to_one=True)
    logits = jnp.asarray(np.log(f), jnp.float32)

    def sample(key, num_clients):
        chosen = jax.random.categorical(key, jnp.broadcast_to(logits, (num_clients,)))
        return jnp.arange(num_clients) == chosen

    def weights(mask):
        return mask.astype(jnp.float32)

    return Participation(sample, weights, pause_when_empty=False, name=f"categorical(f={f.tolist()})",
                         num_clients=f.size, max_active=1, probs=tuple(f.tolist()))


def resolve_participation(spec) -> Participation:
    """Build a scheme from a config value: None / 1.0 -> full, a float or list -> Bernoulli,
    or a mapping ``{"p": ..., "scaling": ...}``."""
    if spec is None:
        return full()
    if isinstance(spec, dict):
        unknown = set(spec) - {"p", "scaling"}
        if unknown:
            raise ValueError(f"unknown participation keys {sorted(unknown)}; use 'p' and 'scaling'")
        if "p" not in spec:
            raise ValueError("participation needs 'p', the probability that a client is active")
        return bernoulli(spec["p"], spec.get("scaling", "active"))
    if isinstance(spec, (int, float)) and not isinstance(spec, bool) and spec == 1:
        return full()
    return bernoulli(spec)


def hold_if_empty(participation: Participation, mask, new, old):
    """Return ``old`` instead of ``new`` (leafwise) for a round with no active client when the
    scheme pauses on empty rounds; otherwise ``new``."""
    if not participation.pause_when_empty:
        return new
    moved = jnp.any(mask)
    return jax.tree_util.tree_map(lambda a, b: jnp.where(moved, a, b), new, old)
