"""A client's compiled programs kept on disk, loaded by a new process instead of compiled again.

Flower's deployment engine (flwr 1.41) starts a new ClientApp process for every message a
SuperNode receives. Each would otherwise trace, lower and compile the client's programs again
(or look them up in JAX's persistent compilation cache, which still traces and lowers, and
whose key holds the cache folder's path). :func:`program` keeps each program's executable
(``jax.experimental.serialize_executable``) in a folder the caller names, under a key of the
run, the program, its argument shapes and :func:`fingerprint` (fedmcmc's source, JAX's
version, the device); a later process loads it without tracing. :func:`cached` keeps small
Python values (a run's array shapes) the same way. Without a folder nothing is written and
every program is compiled in memory: the same program either way, so the same samples.

Loading an executable runs code from that folder: keep it private to its user.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np

from fedmcmc.core import xla


@lru_cache(maxsize=1)
def fingerprint() -> str:
    """What a compiled program depends on besides its run: fedmcmc's source files, the JAX and
    jaxlib versions, the device, ``XLA_FLAGS`` and the x64 flag."""
    import jaxlib

    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    device = jax.devices()[0]
    h.update(repr((jax.__version__, jaxlib.__version__, device.platform, device.device_kind,
                   os.environ.get("XLA_FLAGS", ""), jax.config.jax_enable_x64, xla.COMPILER_OPTIONS)).encode())
    return h.hexdigest()


def _path(folder, key: str, suffix: str) -> Path | None:
    if folder is None:
        return None
    digest = hashlib.sha256(f"{fingerprint()}\0{key}".encode()).hexdigest()[:32]
    return Path(folder) / f"{digest}{suffix}"


def _write(path: Path, data: bytes, check: Callable[[Path], bool] = lambda tmp: True) -> None:
    """Write ``data`` to ``path`` atomically, if ``check`` accepts the written file: another node's
    process may read ``path`` at any time, so it only ever sees a whole file that passed the check."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    if check(tmp):
        os.replace(tmp, path)
    else:
        tmp.unlink(missing_ok=True)


def cached(folder, key: str, make: Callable[[], Any]) -> Any:
    """``make()``, kept in ``folder`` under ``key`` (pickled) and read from there when present."""
    path = _path(folder, key, ".pkl")
    if path is not None and path.exists():
        try:
            return pickle.loads(path.read_bytes())
        except Exception:  # noqa: BLE001 - a torn or foreign file: make it again
            pass
    value = make()
    if path is not None:
        _write(path, pickle.dumps(value))
    return value


def shapes(tree) -> Any:
    """``tree`` as ``ShapeDtypeStruct`` leaves (shape and dtype only): the arguments of :func:`program`."""
    return jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), tree)


class Program:
    """A compiled program loaded from disk: called with the arrays of its shapes (flat, in order),
    returns its outputs as the pytree it was compiled with."""

    def __init__(self, executable, out_tree):
        self.executable, self.out_tree = executable, out_tree

    def __call__(self, *args):
        results = self.executable.execute_sharded([jax.device_put(a) for a in jax.tree_util.tree_leaves(args)])
        return self.out_tree.unflatten([out[0] for out in results.disassemble_into_single_device_arrays()])


def _options():
    from jax._src import compiler

    return compiler.get_compile_options(num_replicas=1, num_partitions=1)


def _load(path: Path):
    from jax._src.lib import xla_client as xc

    blob, out_tree = pickle.loads(path.read_bytes())
    device = jax.devices()[0]
    return Program(device.client.deserialize_executable(blob, xc.DeviceList((device,)), _options()), out_tree)


def program(folder, key: str, fun: Callable, args: tuple) -> Callable:
    """``fun`` compiled by :func:`fedmcmc.core.xla.lower` for the arrays ``args`` (a tuple of
    pytrees), loaded from ``folder`` when a process compiled it before; call it with arrays of
    exactly these shapes and dtypes.

    An executable is kept (the way JAX's persistent cache keeps one) only if, loaded back, it
    gives the compiled program's outputs bit for bit on ``args``; it is checked before it takes its
    place in ``folder``, so a process never loads one that failed (the nodes of one machine share
    the folder: a node once ran an executable without its kernels that another had just written,
    and its message failed)."""
    leaves, tree = jax.tree_util.tree_flatten(shapes(args))
    path = _path(folder, f"{key}\0{tree}\0{[(a.shape, str(a.dtype)) for a in leaves]}", ".exe")
    if path is not None and path.exists():
        try:
            return _load(path)
        except Exception:  # noqa: BLE001 - a torn or foreign file: compile again
            pass
    compiled = xla.lower(fun, *shapes(args), keep_unused=True).compile()
    if path is None or compiled._params.const_args:  # constants are not part of the executable: not kept
        return compiled
    executable = compiled._executable.xla_executable

    def same(tmp: Path) -> bool:
        try:  # an executable JAX itself loaded from its persistent cache serialises without its kernels
            want, got = compiled(*args), _load(tmp)(*args)
            return jax.tree_util.tree_all(jax.tree_util.tree_map(
                lambda a, b: np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True), want, got))
        except Exception:  # noqa: BLE001 - not loadable: not kept
            return False

    _write(path, pickle.dumps((executable.client.serialize_executable(executable), compiled.out_tree)), same)
    return compiled
