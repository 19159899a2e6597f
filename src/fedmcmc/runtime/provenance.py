"""What produced a results file: the code's commit and the machine, recorded in every JSON file that
:func:`fedmcmc.runtime.io.write_json` writes (a run's ``results.json`` and ``summary.json``, a
study's ``results.json``, ``bench.json``) under the key ``provenance``.

The commit is that of the checkout the imported package lives in (``"unknown"`` for an installed
package outside a git checkout), with whether its tracked files differ from that commit
(``dirty``; untracked files, such as results folders, do not count). A figure's provenance is
its results file: the tables of docs/reproductions.md are generated from them
(:mod:`fedmcmc.app.tables`).
"""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path

__all__ = ["record"]

_PACKAGE = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=_PACKAGE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _jax() -> dict:
    try:
        import jax
    except ImportError:
        return {"jax": None, "backend": None}
    try:  # a writer must not be what starts XLA (fedmcmc's processes start it with one thread first)
        from jax._src import xla_bridge

        started = xla_bridge.backends_are_initialized()
    except (ImportError, AttributeError):
        started = True
    return {"jax": jax.__version__, "backend": jax.default_backend() if started else None}


@functools.lru_cache(maxsize=1)
def _code() -> dict:
    from fedmcmc import __version__

    # the package's own checkout: an installed copy inside some other repository is not one
    tracked = _git("ls-files", "--error-unmatch", "__init__.py") is not None
    commit = _git("rev-parse", "HEAD") if tracked else None
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit.strip() if commit else "unknown", "dirty": None if status is None else bool(status.strip()),
            "version": __version__}


def _machine() -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "memory_bytes": _memory_bytes(), "python": platform.python_version(), **_jax()}


def record() -> dict:
    """The provenance of a results file written now.

    Returns
    -------
    dict
        ``commit`` (the checkout's ``HEAD``, or ``"unknown"``), ``dirty`` (tracked files changed
        since it; None outside a checkout), ``version`` (the package's) and ``machine``: the
        ``platform``, ``processor``, ``cores``, ``memory_bytes``, ``python``, ``jax`` version and
        JAX's default ``backend`` (None when JAX has not started in this process).
    """
    return {**_code(), "machine": _machine()}
