"""The one explicit CPU tuning call: chains over worker processes.

:func:`tune` (``fedmcmc.tune_cpu``) makes :func:`fedmcmc.simulate` spread chains over worker
processes, one per core (:mod:`fedmcmc.runtime.workers`, and docs/design.md on why processes
and not XLA devices). The command line calls it for its own processes. How each program is
compiled is :mod:`fedmcmc.core.xla`.
"""

from __future__ import annotations

import os


def available_cores() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


_WORKERS = 1


def tune(workers: int | None = None) -> int:
    """Spread the chains of every later :func:`fedmcmc.simulate` call over worker processes.

    Parameters
    ----------
    workers
        Number of worker processes; ``None`` for one per available core, ``1`` to run in
        this process again (the default before any call).

    Returns
    -------
    int
        The number of workers now in force.

    Notes
    -----
    Each worker is a separate Python process with one single-threaded XLA CPU device,
    pinned to its own core when there are enough cores; chain ``c`` gets the same keys in
    whichever process runs it, so the samples are the same bit for bit as in one process
    (tested). Nothing in this process's JAX changes. Workers start on the first run that
    uses them (about 2 s) and are reused until the process exits. Samplers, data and
    statistics are sent to them with cloudpickle; a run whose sampler cannot be pickled
    raises. On GPU or TPU the setting is ignored.
    """
    global _WORKERS
    if workers is None:
        workers = len(available_cores())
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be a positive integer or None for one per core (got {workers!r})")
    _WORKERS = int(workers)
    return _WORKERS


def default_workers() -> int:
    """The worker count set by :func:`tune` (1 until it is called)."""
    return _WORKERS
