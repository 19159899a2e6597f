"""What makes a run the run it is, and which folder holds it: a resume never mixes two runs, and an
output folder is never overwritten silently.

A run's identity is an ordered mapping of named parts (:func:`identity`), each a number, a string
or a list of them: the settings the caller gives (a config's keys, ``[sampler] step_size``), then
the seed, counts and schedule, a hash of each client's data and of ``theta0``, and the sampler
described structurally (:func:`describe`: its functions by name with the values they close
over, the model's among them). A checkpoint stores it as JSON text, and a resume whose identity
differs is refused naming the first part that differs (:func:`check_resume`).

A folder holds a run when it has a checkpoint (``chunks/state.npz``, or a study's
``runs/*/chunks/state.npz``), ``results.json`` or ``posterior.nc`` (:func:`claim`); a new run
goes there only with ``resume`` or ``overwrite``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
import types
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import numpy as np

#: How deep :func:`describe` goes into nested functions and containers.
DEPTH = 12
#: Packages whose objects are described by name only: library code, whose internals are no setting.
_LIBRARIES = {"jax", "jaxlib", "numpy", "scipy", "builtins", "functools", "typing", "abc", "math", "operator"}
#: Arrays of at most this many entries are described by their values, larger ones by a hash.
_SHOWN = 4


def _name(obj) -> str:
    """A module's, class's or function's name; another object's type's name."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if not callable(obj):
        obj = type(obj)
    return f"{getattr(obj, '__module__', None) or ''}.{getattr(obj, '__qualname__', type(obj).__qualname__)}"


def _library(obj) -> bool:
    return (getattr(obj, "__module__", None) or "builtins").split(".")[0] in _LIBRARIES


def _array(a) -> str:
    a = np.asarray(a)
    kind = f"{a.dtype}{list(a.shape)}"
    if a.size <= _SHOWN:
        return f"{kind} {a.tolist()}"
    return f"{kind} sha256:{hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]}"


def describe(obj, depth: int = DEPTH) -> Any:
    """``obj`` as JSON values that are the same in every process for the same settings.

    Numbers, strings and None are themselves; arrays their dtype, shape and values (a hash of
    their bytes when larger); a function its module and qualified name (under the key ``""``)
    with the values it closes over and its defaults, by name; a ``functools.partial`` its
    function and arguments; NamedTuples, dataclasses, dicts and sequences their entries; other
    objects their type's name with their attributes. Objects of library packages (JAX, NumPy)
    are their names only. Nesting stops at ``depth`` and at a cycle (no ``id`` or address is
    ever part of a description).
    """
    return _describe(obj, depth, frozenset())


def _describe(obj, depth: int, seen: frozenset) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, (np.ndarray, jax.Array)):
        return _array(obj)
    if isinstance(obj, (type, types.ModuleType, types.BuiltinFunctionType)) or depth <= 0 or id(obj) in seen:
        return _name(obj)
    seen = seen | {id(obj)}

    def inner(x):
        return _describe(x, depth - 1, seen)

    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return {"": _name(type(obj)), **{f: inner(getattr(obj, f)) for f in obj._fields}}
    if isinstance(obj, (list, tuple)):
        return [inner(x) for x in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted((inner(x) for x in obj), key=lambda d: json.dumps(d, sort_keys=True))
    if isinstance(obj, Mapping):
        return {str(k): inner(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, functools.partial):
        return {"": "functools.partial", "func": inner(obj.func), "args": inner(obj.args),
                "keywords": inner(obj.keywords)}
    if isinstance(obj, types.FunctionType):
        if _library(obj):
            return _name(obj)
        code = obj.__code__
        cells = {name: cell.cell_contents for name, cell in zip(code.co_freevars, obj.__closure__ or ())
                 if _filled(cell)}
        defaults = dict(zip(code.co_varnames[code.co_argcount - len(obj.__defaults__ or ()):code.co_argcount],
                            obj.__defaults__ or ()))
        values = {**cells, **defaults, **(obj.__kwdefaults__ or {})}
        return {"": _name(obj), **{name: inner(values[name]) for name in sorted(values)}}
    if hasattr(obj, "__wrapped__"):  # jax.jit, functools.wraps
        return inner(obj.__wrapped__)
    if _library(obj) or _library(type(obj)):
        return _name(obj)
    if dataclasses.is_dataclass(obj):
        return {"": _name(type(obj)), **{f.name: inner(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    attrs = getattr(obj, "__dict__", {})
    return {"": _name(type(obj)), **{k: inner(v) for k, v in sorted(attrs.items()) if not k.startswith("_")}}


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # a cell not yet assigned
        return False
    return True


def _flat(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for key, v in value.items():
            _flat(f"{prefix}.{key}" if prefix and key else prefix or key, v, out)
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        for i, v in enumerate(value):
            _flat(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = value


def settings_parts(cfg: Mapping) -> dict:
    """A parsed config's keys as parts, named as a user writes them: ``[sampler] step_size``
    (a nested table's keys joined by dots)."""
    out: dict = {}
    for section, table in cfg.items():
        if isinstance(table, Mapping):
            flat: dict = {}
            _flat("", describe(dict(table)), flat)
            out.update({f"[{section}] {key}": value for key, value in flat.items()})
        else:
            out[section] = describe(table)
    return out


def data_hash(data) -> dict[str, str]:
    """Each client's data points (:class:`fedmcmc.data.federated.FederatedData`), hashed with their
    dtypes and shapes: ``{"client_0": ..., ...}``."""
    out = {}
    for i in range(data.num_clients):
        h = hashlib.sha256()
        for leaf in jax.tree_util.tree_leaves(data.unpadded(i)):
            leaf = np.ascontiguousarray(leaf)
            h.update(f"{leaf.dtype}{leaf.shape}".encode())
            h.update(leaf.tobytes())
        out[f"client_{i}"] = h.hexdigest()[:16]
    return out


def identity(settings: Mapping | None = None, **parts) -> dict:
    """The parts of a run's identity, in order: the caller's ``settings`` (:func:`settings_parts`)
    first, then ``parts``, each flattened into dotted names (``sampler.client_step.step_size``)."""
    out = settings_parts(settings or {})
    for name, value in parts.items():
        _flat(name, describe(value), out)
    return out


def dumps(parts: dict) -> np.ndarray:
    """``parts`` as the JSON text a checkpoint stores."""
    return np.asarray(json.dumps(parts))


def check_resume(folder: Path, saved: Mapping, parts: dict) -> None:
    """Refuse (ValueError) to resume the run of ``folder`` whose checkpoint ``saved`` (its arrays by
    name) was written by another run than the one of ``parts``, naming the first part that differs."""
    if "identity" not in saved:
        raise ValueError(f"cannot resume from {folder}: its checkpoint was written by an older fedmcmc that did "
                         "not record the run's settings; use another --out folder, or --overwrite to start over")
    before = json.loads(str(saved["identity"]))
    for key in [*parts, *(k for k in before if k not in parts)]:
        was, now = before.get(key, "(none)"), parts.get(key, "(none)")
        if json.dumps(was) != json.dumps(now):  # as JSON text, so that NaN equals NaN
            raise ValueError(f"cannot resume from {folder}: its run had {key} = {_shown(was)}, this one "
                             f"{_shown(now)}; use another --out folder, or --overwrite to replace it")


def _shown(value) -> str:
    """A part as a refusal shows it."""
    return value if isinstance(value, str) else json.dumps(value)


def holds_run(out: Path) -> list[Path]:
    """The files by which the folder ``out`` holds a run (module docstring); empty if none."""
    out = Path(out)
    marks = [out / "chunks" / "state.npz", out / "results.json", out / "posterior.nc"]
    return [p for p in marks if p.exists()] + sorted(out.glob("runs/*/chunks/state.npz"))


#: What a run leaves in its folder and ``overwrite`` removes: its chunks and checkpoint, a study's
#: runs, and the outputs that say what the run found.
RUN_FILES = ("chunks", "runs", "results.json", "posterior.nc", "summary.json")


def claim(out, resume: bool = False, overwrite: bool = False, echo: Callable[[str], None] = print) -> None:
    """Make the folder ``out`` this run's, before anything is written to it: a folder that holds
    a run (:func:`holds_run`) is refused (ValueError, nothing deleted) unless ``resume`` (the
    checkpoint is checked as the run starts) or ``overwrite`` (the old run's :data:`RUN_FILES` are
    removed, and ``echo`` says so in one line)."""
    if resume and overwrite:
        raise ValueError("give --resume (continue the run) or --overwrite (replace it), not both")
    out = Path(out)
    if resume or not holds_run(out):
        return
    if not overwrite:
        raise ValueError(f"{out} holds a run; continue it with --resume, or replace it with --overwrite "
                         "(or use another --out folder)")
    for name in RUN_FILES:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    echo(f"fedmcmc: --overwrite: removed the run that was in {out}")
