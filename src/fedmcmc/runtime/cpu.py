"""The one explicit CPU tuning call: chains over worker processes, XLA on one thread.

:func:`tune` (``fedmcmc.tune_cpu``) makes :func:`fedmcmc.simulate` spread chains over worker
processes, one per core (:mod:`fedmcmc.runtime.workers`, and docs/design.md on why processes
and not XLA devices), and starts this process's XLA with one intra-op thread
(:func:`one_thread_xla`) if it has not started yet. fedmcmc's own processes (the command line,
worker processes, Flower apps and node workers) start XLA that way. How each program is
compiled is :mod:`fedmcmc.core.xla`.
"""

from __future__ import annotations

import os
import threading


def available_cores() -> list[int]:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return list(range(os.cpu_count() or 1))


_WORKERS = 1
_ONE_THREAD = False  # this process started XLA with one intra-op thread (one_thread_xla)


def one_thread_xla() -> bool:
    """Start JAX's backends with one XLA intra-op thread, if they have not started yet.

    XLA's CPU client takes as many intra-op threads as the cores the starting thread may use, and
    compiles for that many: it splits large loop fusions into one part per thread. A worker
    process pinned to one core with two such threads ran the toy QLSD* 1.55 times slower than
    with one: the second thread spins beside the first, on the same core. In a process on two
    cores the second thread runs some kernels beside the first: 18% faster on the toy (and 8%
    at 1.6 times the CPU on two smaller programs; docs/design.md, "XLA on one thread").
    Started with one thread, every process compiles the same programs whatever its machine's
    core count, so its draws do not depend on it (docs/design.md).

    The calling thread is pinned to one core while the backends start and then given back its
    cores, with the threads started meanwhile (XLA's), so the process still runs on all of them.

    Returns
    -------
    bool
        Whether this process's XLA has one intra-op thread because of this call or an earlier
        one (False: it had started already, or the OS cannot pin threads).
    """
    global _ONE_THREAD
    if _ONE_THREAD:
        return True
    try:
        from jax._src.xla_bridge import backends_are_initialized
    except ImportError:  # pragma: no cover - depends on the JAX version
        return False
    if backends_are_initialized() or not hasattr(os, "sched_setaffinity"):
        return False
    import jax

    cores = available_cores()
    before = set(os.listdir("/proc/self/task"))
    os.sched_setaffinity(0, cores[:1])
    try:
        jax.devices()
    finally:
        for thread in {str(threading.get_native_id())} | (set(os.listdir("/proc/self/task")) - before):
            try:
                os.sched_setaffinity(int(thread), cores)
            except OSError:  # a thread that has ended meanwhile
                pass
    _ONE_THREAD = True
    return True


def started_one_thread() -> bool:
    """Whether :func:`one_thread_xla` started this process's XLA (worker processes then do too)."""
    return _ONE_THREAD


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
    If JAX has not started in this process yet, it starts now with one XLA intra-op thread
    (:func:`one_thread_xla`), as in fedmcmc's own processes: the programs compiled here are then
    those of the command line and of a Flower node on any machine. Otherwise this process's
    JAX stays as it is.

    Each worker is a separate Python process with one single-threaded XLA CPU device,
    pinned to its own core when there are enough cores; it compiles the programs this process
    compiles (for as many intra-op threads), and chain ``c`` gets the same keys in whichever
    process runs it, so the samples are the same bit for bit as in one process (tested).
    Workers start on the first run that uses them (about 2 s) and are reused until the process
    exits. Samplers, data and statistics are sent to them with cloudpickle; a run whose sampler
    cannot be pickled raises. On GPU or TPU the setting is ignored.
    """
    global _WORKERS
    one_thread_xla()
    if workers is None:
        workers = len(available_cores())
    if isinstance(workers, bool) or int(workers) != workers or workers < 1:
        raise ValueError(f"workers must be a positive integer or None for one per core (got {workers!r})")
    _WORKERS = int(workers)
    return _WORKERS


def default_workers() -> int:
    """The worker count set by :func:`tune` (1 until it is called)."""
    return _WORKERS
