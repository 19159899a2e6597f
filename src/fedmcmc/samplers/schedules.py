"""Step-size schedules: a sampler's ``step_size`` as a function of its iteration counter.

FA-HMC's dynamic step (Liang et al. 2024, Proposition 4.5, proved as Proposition J.1 of the
supplement, after Cheng et al. 2018, Theorem 14): the step ``eta`` for the first ``t_1``
iterations, then stages that each last twice the one before, ``t_{s+1} = 2 t_s``, the step
divided by ``sqrt(2)`` from one stage to the next:

    eta_j = eta 2^{-s(j) / 2},     s(j) = #{s >= 1 : j >= (2^s - 1) t_1},

so that ``(K eta_j)^2`` halves as a stage's length doubles: each stage contracts the distance to
the target by the same factor, and the discretisation's bias falls with ``(K eta_j)^2``. The
first stage's length that the proposition sets,

    t_1 = ceil(log 8 / -log(1 - mu (K eta)^2 / 4))    iterations (trajectories of K leapfrog steps),

contracts the initial distance eightfold at rate ``mu``, the potential's strong convexity
(:func:`first_stage`). The proof's general form divides the step by ``a^{1/4}`` with ``a = 2``;
its own contraction step uses ``(K eta)^2 / 2^{j-1}`` in stage ``j``, that is ``sqrt(2)``, the
factor of the proposition's statement, which is the one used here.

A decreasing step trades mixing for bias: a stage advances the chain by the same Langevin time
as the first, so the time, and the effective draws, grow with the logarithm of the rounds
(:func:`decayed_rounds`).
"""

from __future__ import annotations

from typing import Callable

import jax.numpy as jnp
import numpy as np

from fedmcmc.core import checks

#: The step's factor from one stage to the next (Proposition 4.5: ``eta / sqrt(2)``).
STAGE_FACTOR = float(np.sqrt(2.0))
_INT32_MAX = 2**31 - 1


def stage_starts(first: int) -> np.ndarray:
    """``(2^s - 1) t_1`` for ``s = 1, 2, ...``: where the stages after the first begin, up to int32's range."""
    first = checks.positive_int("step_decay", first)
    starts, s = [], 1
    while (2**s - 1) * first <= _INT32_MAX:
        starts.append((2**s - 1) * first)
        s += 1
    return np.asarray(starts, np.int64)


def doubling_stages(step_size: float, first: int) -> Callable:
    """The schedule ``j -> eta 2^{-s(j)/2}`` of the module docstring: ``eta = step_size`` for the
    first ``first`` iterations, then stages of doubling length, the step divided by ``sqrt(2)``
    at each (as float32; ``j`` an integer counter, traced or not)."""
    eta = checks.step_size(step_size)
    if callable(eta):
        raise ValueError("step_decay needs a constant step_size to decay from, not a schedule")
    starts = stage_starts(first)
    values = np.float32(eta) * STAGE_FACTOR ** -np.arange(len(starts) + 1, dtype=np.float64)
    starts_32, values_32 = starts.astype(np.int32), values.astype(np.float32)

    def schedule(j):
        stage = jnp.sum(jnp.asarray(j, jnp.int32) >= jnp.asarray(starts_32))
        return jnp.asarray(values_32)[stage]

    return schedule


def first_stage(mu: float, step_size: float, num_leapfrog: int, per_round: float | None = None) -> int:
    """Proposition J.1's ``t_1 = ceil(log 8 / -log(1 - mu (K eta)^2 / 4))`` iterations, rounded up
    to whole rounds when a round is a whole number ``per_round`` of them (``T`` trajectories on
    FA-HMC's trajectory clock), as the proposition's ``t_1`` is a multiple of ``T``."""
    rate = float(mu) * (int(num_leapfrog) * float(step_size)) ** 2 / 4
    if not 0 < rate < 1:
        raise ValueError(f"step_decay = \"auto\" needs 0 < mu (K eta)^2 / 4 < 1 (got {rate:.3g} from mu = {mu:.3g}, "
                         f"K eta = {num_leapfrog * step_size:.3g}); give step_decay as a number of trajectories")
    t1 = int(np.ceil(np.log(8.0) / -np.log1p(-rate)))
    if per_round is not None and float(per_round).is_integer() and per_round >= 1:
        t1 = int(np.ceil(t1 / per_round) * per_round)
    return min(t1, _INT32_MAX)


def decayed_rounds(first: int, per_round: float, start: int, stop: float) -> float:
    """``sum_{k = start}^{stop - 1} (eta_{j(k)} / eta)^2``, ``j(k) = floor(k per_round)`` the
    iteration running at round ``k``'s start: the Langevin time of rounds ``start .. stop - 1``
    (``(K eta_j)^2 / 2`` per trajectory) in rounds at the constant step. Each stage adds ``t_1``
    iterations' worth, so the time grows with ``log(stop)``."""
    starts = stage_starts(first) / float(per_round)
    begins = np.concatenate([[0.0], np.ceil(starts)])  # the round each stage begins in
    ends = np.concatenate([begins[1:], [np.inf]])
    lengths = np.clip(np.minimum(ends, stop) - np.maximum(begins, start), 0.0, None)
    return float(np.sum(lengths * 2.0 ** -np.arange(len(begins), dtype=np.float64)))
