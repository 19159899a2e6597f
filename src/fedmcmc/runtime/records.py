"""What a run records, in both runtimes: its result and its checkpoints.

A run writes ``chunks/chunk_NNNNNN.npz`` (the kept draws and the bit counts of a chunk of
rounds) and ``chunks/state.npz`` (what it needs to go on, with the run's identity,
:mod:`fedmcmc.runtime.identity`) as it goes; :func:`assemble` turns the chunks into a
:class:`SimulationResult`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np


class DivergenceError(RuntimeError):
    """A chain reached NaN or inf, by round ``iteration``; ``step`` is the run's step record
    (``{"value", "rule"}``, with ``"lambda_max"`` when ``step_size = "auto"`` chose it) when
    known, for the advice (:func:`step_advice`)."""

    def __init__(self, iteration: int, chains: list[int], step: dict | None = None):
        self.iteration = iteration
        self.chains = chains
        self.step = step
        super().__init__(f"the run diverged (NaN/inf in chain(s) {chains[:5]}) by iteration {iteration}: "
                         + step_advice(step))


def step_advice(step: dict | None) -> str:
    """What to do about a divergence, from the run's step record ``step`` (see
    :class:`DivergenceError`; None or ``{"value": None}`` when the step is not known)."""
    value = None if step is None else step.get("value")
    if value is None:
        return 'lower the step size, or set step_size = "auto" to choose it from the curvature at the mode'
    values = np.atleast_1d(np.asarray(value, np.float64))
    half = f"{values[0] / 2:.3g}" if np.ndim(value) == 0 else "[" + ", ".join(f"{v / 2:.3g}" for v in values) + "]"
    if step.get("lambda_max") is not None:
        return (f'set step_size below the one "auto" chose from the curvature at the mode (lambda_max = '
                f'{step["lambda_max"]:.4g}), e.g. step_size = {half}: the chains start away from the mode, where '
                "the curvature can be larger")
    now = f"{values[0]:g}" if np.ndim(value) == 0 else "[" + ", ".join(f"{v:g}" for v in values) + "]"
    return (f"lower the step size (now {now}), e.g. to {half}, "
            'or set step_size = "auto" to choose it from the curvature at the mode')


class SimulationResult(NamedTuple):
    """What a run returns (numpy arrays).

    Attributes
    ----------
    samples
        ``[chain, draw, d]``: the server's parameter after each kept round, or, for a
        sampler with ``m = draws_per_round > 1``, the ``m`` draws of each kept round.
    draw_iterations
        ``[draw]``: the round count (1-based) at which each draw was taken; draw ``j`` of
        ``m`` in round ``k`` sits at ``k - 1 + (j + 1) / m``.
    bits_up, bits_down, active
        ``[chain, draw]``: bits uploaded and downloaded, and client participations, summed
        over the rounds since the previous draw (with ``m > 1``, a round's counts sit on its
        last draw).
    statistics
        ``[chain, iteration, ...]`` values of ``statistic(theta)`` at every round after burn-in
        (unthinned), or None.
    total_bits_up, total_bits_down
        ``[chain]``: totals over the whole run, burn-in and setup exchange included.
    num_iterations, burn_in, thinning
        The run's settings.
    wall_seconds
        Time spent running rounds (compilation included), summed over resumed sessions.
    draws_per_round
        ``m``, the sampler's draws per round.
    setup_bits_up, setup_bits_down
        ``[chain]``: bits of the setup exchange before round 1 (zero without one).
    """

    samples: np.ndarray
    draw_iterations: np.ndarray
    bits_up: np.ndarray
    bits_down: np.ndarray
    active: np.ndarray
    statistics: np.ndarray | None
    total_bits_up: np.ndarray
    total_bits_down: np.ndarray
    num_iterations: int
    burn_in: int
    thinning: int
    wall_seconds: float
    draws_per_round: int = 1
    setup_bits_up: np.ndarray | None = None
    setup_bits_down: np.ndarray | None = None


def check_finite(positions: np.ndarray, rounds) -> None:
    """Raise :class:`DivergenceError` if a draw of ``positions`` ``[chains, draws, ...]`` (taken
    after rounds ``rounds``, one per draw) is NaN or inf, naming the first such round."""
    bad = ~np.all(np.isfinite(positions.reshape(positions.shape[:2] + (-1,))), axis=-1)  # [chains, draws]
    if bad.any():
        first = int(np.argmax(bad.any(axis=0)))
        raise DivergenceError(int(np.asarray(rounds)[first]), np.flatnonzero(bad.any(axis=1)).tolist())


def save_npz(path: Path, **arrays):
    """Write ``arrays`` to ``path`` atomically (a killed run never leaves half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def assemble(pieces, num_iterations, burn_in, thinning, has_stats, wall, m, setup_bits) -> SimulationResult:
    def cat(name):
        return np.concatenate([p[name] for p in pieces], axis=1)

    rounds = np.arange(1, num_iterations // thinning + 1) * thinning
    keep = rounds > burn_in
    up, down, active = cat("up"), cat("down"), cat("active")

    def per_draw(a):
        """Per-round counts as per-draw counts: on the last draw of each round, 0 on the others."""
        a = a[:, keep]
        if m == 1:
            return a
        out = np.zeros(a.shape[:1] + (a.shape[1], m), a.dtype)
        out[..., -1] = a
        return out.reshape(a.shape[0], -1)

    if m == 1:
        draw_iterations = rounds[keep]
    else:  # draw j of round k sits at k - 1 + (j + 1) / m
        draw_iterations = (rounds[keep, None] - 1 + np.arange(1, m + 1) / m).ravel()
    return SimulationResult(
        samples=cat("positions"),
        draw_iterations=draw_iterations,
        bits_up=per_draw(up),
        bits_down=per_draw(down),
        active=per_draw(active),
        statistics=cat("stats") if has_stats else None,
        total_bits_up=up.sum(axis=1) + setup_bits[0],
        total_bits_down=down.sum(axis=1) + setup_bits[1],
        num_iterations=num_iterations,
        burn_in=burn_in,
        thinning=thinning,
        wall_seconds=wall,
        draws_per_round=m,
        setup_bits_up=setup_bits[0],
        setup_bits_down=setup_bits[1],
    )
