"""Where the trajectories of federated HMC start within its rounds (FA-HMC's two clocks).

A trajectory is ``K`` leapfrog steps from a fresh momentum; trajectories start at the global
leapfrog steps ``n = 0, K, 2K, ...``, and round ``k`` runs the steps ``n = k S + t``,
``t = 0..S-1``, with ``S`` the leapfrog steps per round: ``T`` on the leapfrog clock (the
paper's experiments), ``K T`` on the trajectory clock (Algorithm 3 as printed). When ``K``
does not divide ``S`` a trajectory may span rounds, where the round's trajectories start
depends on ``k`` through ``k S mod K``, and the rounds repeat with period
``P = K / gcd(K, S)``. See :mod:`fedmcmc.samplers.fa_hmc`.
"""

from __future__ import annotations

from math import gcd

import jax
import jax.numpy as jnp

from fedmcmc.core import checks

#: What ``local_steps`` (T) counts: leapfrog steps (the paper's experiments) or trajectories (Algorithm 3).
CLOCKS = ("leapfrog", "trajectory")


def steps_per_round(num_leapfrog: int, local_steps: int, clock: str) -> int:
    """Leapfrog steps per round: ``T`` on the leapfrog clock, ``K T`` on the trajectory clock."""
    checks.choice("clock", clock, CLOCKS, ': "leapfrog" (T counts leapfrog steps, the paper\'s experiments) or '
                  '"trajectory" (T counts trajectories of K steps, Algorithm 3)')
    return local_steps * num_leapfrog if clock == "trajectory" else local_steps


def round_period(num_leapfrog: int, local_steps: int, clock: str = "leapfrog") -> int:
    """``P = K / gcd(K, S)``: the rounds repeat every ``P`` rounds (``S`` steps per round)."""
    K = int(num_leapfrog)
    return K // gcd(K, steps_per_round(K, int(local_steps), clock))


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


def run_round(step, draw_momentum, step_size_at, k, steps: int, num_leapfrog: int, carry):
    """Run round ``k``'s ``steps`` leapfrog steps from ``carry = (theta, p, m)``.

    First the tail of a trajectory begun in an earlier round (only when ``K`` does not divide
    ``steps``; ``p`` is its momentum), then every trajectory begun in the round: its momentum
    ``draw_momentum(j, theta)`` for the round's ``j``-th one, then its steps.
    ``step(t, carry, eta)`` is the round's local step ``t``, with ``eta = step_size_at(j)``
    for the global trajectory counter ``j``. The loop bounds are static when ``K`` divides
    ``steps``. Returns the final ``carry``.
    """
    spanning = steps % num_leapfrog != 0

    def run(start, length, eta, carry):
        """Local steps start .. start + length - 1 of the round."""
        return jax.lax.fori_loop(0, length, lambda i, c: step(start + i, c, eta), carry)

    first, count, counter = round_trajectories(k, steps, num_leapfrog)
    if spanning:  # finish the trajectory begun in an earlier round
        carry = run(0, jnp.minimum(first, steps), step_size_at(counter), carry)
        counter = counter + (first > 0)

    def trajectory(j, carry):
        theta, _, m = carry
        p = draw_momentum(j, theta)
        start = first + j * num_leapfrog
        length = jnp.minimum(num_leapfrog, steps - start) if spanning else num_leapfrog
        return run(start, length, step_size_at(counter + j), (theta, p, m))

    return jax.lax.fori_loop(0, count, trajectory, carry)
