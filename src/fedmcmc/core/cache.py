"""Where fedmcmc keeps what outlives a run, and the command line's cache of compiled programs.

:func:`user_cache` is the one folder: NUTS references (:mod:`fedmcmc.evaluation.reference`), a
Flower node's compiled client programs (:mod:`fedmcmc.app.flower.apps`) and the command line's
XLA programs (:func:`keep_compiled_programs`) go in folders of it. Importing fedmcmc sets
nothing; only the command line turns the program cache on, for its own processes.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Bytes the command line's program cache may hold; the least recently used programs go first.
PROGRAM_CACHE_BYTES = 2 * 2**30


def user_cache() -> Path:
    """``$FEDMCMC_CACHE``, else ``$XDG_CACHE_HOME/fedmcmc``, else ``~/.cache/fedmcmc``."""
    if os.environ.get("FEDMCMC_CACHE"):
        return Path(os.environ["FEDMCMC_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fedmcmc"


def keep_compiled_programs(max_bytes: int = PROGRAM_CACHE_BYTES) -> Path | None:
    """Keep this process's compiled XLA programs in ``user_cache()/xla`` (JAX's persistent
    compilation cache, every program, at most ``max_bytes`` in all, the least recently used
    dropped first), so that a run repeated or resumed, and its worker processes
    (:mod:`fedmcmc.runtime.workers` passes them these settings), load the programs instead of
    compiling them again. Left alone, and ``None`` returned, if JAX already has a cache folder
    (``JAX_COMPILATION_CACHE_DIR``, ``jax_compilation_cache_dir``) or the folder cannot be made.

    Every process that writes there must start XLA as the command line does, on one intra-op
    thread (:func:`fedmcmc.runtime.cpu.one_thread_xla`): the thread count is compiled into a
    program but is not part of JAX's cache key.
    """
    import jax

    if jax.config.jax_compilation_cache_dir:  # set in jax.config, or by JAX_COMPILATION_CACHE_DIR
        return None
    folder = user_cache() / "xla"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_compilation_cache_max_size", int(max_bytes))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
