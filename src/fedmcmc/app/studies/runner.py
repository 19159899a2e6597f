"""The chores every paper study shares, written once, so that a study module holds only its science.

A study is a module with

- ``NAME`` (for ``fedmcmc reproduce NAME``) and ``SUMMARY`` (one line for ``fedmcmc list``);
- ``FULL`` and ``QUICK``: its settings at the paper's size and for ``--quick``;
- ``science(cfg, run) -> Findings``: the study itself, given its merged settings ``cfg`` and the
  :class:`Run` that simulates and writes into the output folder.

:func:`run_study` merges the settings (:func:`resolve`), times the science and writes
``results.json`` as ``{"experiment": NAME, "quick": ..., "settings": ..., <the findings>,
"wall_seconds": ...}``, then ``posterior.nc`` and the figures.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Protocol

from fedmcmc.runtime import identity, io
from fedmcmc.runtime.simulator import simulate


class Run(NamedTuple):
    """One invocation of a study: its name, output folder and how its chains run."""

    name: str
    out: Path
    quick: bool
    progress: bool = True
    resume: bool = False
    settings: dict | None = None

    def simulate(self, *args, folder: str | None, **kwargs):
        """:func:`fedmcmc.runtime.simulator.simulate` with this run's progress bar and resume, the
        chunks and checkpoints in ``out/runs/folder`` (kept in memory only when ``folder`` is None);
        the study's merged ``settings`` are part of each run's identity."""
        return simulate(*args, progress=self.progress, resume=self.resume, settings=self.settings,
                        out_dir=None if folder is None else self.out / "runs" / folder, **kwargs)

    def write_posterior(self, path: str, results: Mapping, **attrs) -> Path:
        """Write the draws of ``results`` (label -> simulation result) to ``out/path`` (netCDF),
        labelled with the study's name, ``quick`` and ``attrs``."""
        return io.write_posterior(self.out / path, results, attrs={"experiment": self.name, "quick": self.quick,
                                                                   **attrs})


class Findings(NamedTuple):
    """What a study's science found, for :func:`run_study` to write."""

    settings: dict
    """``results.json``'s ``settings``: the merged settings and the facts derived from them."""
    results: dict
    """The rest of ``results.json``, in order."""
    posterior: Mapping | None = None
    """Label -> simulation result, written to ``posterior.nc`` (none when empty or None)."""
    figures: Mapping[str, Callable[[Path], object]] | None = None
    """File name -> a function that draws the figure at the path it is given."""


class Study(Protocol):
    """A study module (module docstring)."""

    NAME: str
    SUMMARY: str
    FULL: dict
    QUICK: dict

    def science(self, cfg: dict, run: Run) -> Findings: ...


def resolve(study: Study, quick: bool = False, seed: int | None = None, overrides: dict | None = None) -> dict:
    """A copy of ``study.QUICK`` (if ``quick``) or ``study.FULL``, updated with ``overrides`` (from
    ``--set``) and ``seed`` (from ``--seed``, when given)."""
    cfg = dict(study.QUICK if quick else study.FULL)
    cfg.update(overrides or {})
    if seed is not None:
        cfg["seed"] = seed
    return cfg


def run_study(study: Study, out: str | Path, quick: bool = False, seed: int | None = None,
              settings: dict | None = None, resume: bool = False, progress: bool = True,
              overwrite: bool = False) -> dict:
    """Run ``study`` with its full or quick settings updated by ``settings`` and ``seed``; write
    ``out/results.json``, ``out/posterior.nc`` and the figures; return what ``results.json`` holds.
    A folder that holds a run takes this one only with ``resume`` (each simulation resumes its own,
    refused if it is another's) or ``overwrite`` (:func:`fedmcmc.runtime.identity.claim`)."""
    cfg = resolve(study, quick, seed, settings)
    identity.claim(out, resume, overwrite)
    run = Run(study.NAME, Path(out), quick, progress, resume, {"study": study.NAME, "quick": quick, **cfg})
    started = time.perf_counter()
    found = study.science(cfg, run)
    payload = {"experiment": study.NAME, "quick": quick, "settings": found.settings, **found.results,
               "wall_seconds": time.perf_counter() - started}
    io.write_json(run.out / "results.json", payload)
    if found.posterior:
        run.write_posterior("posterior.nc", found.posterior)
    for name, draw in (found.figures or {}).items():
        draw(run.out / name)
    return payload


def overrides(study: Study, pairs: list[str]) -> dict:
    """Parse ``--set KEY=VALUE`` pairs against the study's own settings (numbers, or
    comma-separated values for list settings)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in study.FULL:
            raise ValueError(f"--set {pair!r}: use KEY=VALUE with KEY one of {', '.join(sorted(study.FULL))}")
        default = study.FULL[key]
        if isinstance(default, (list, tuple)) and all(isinstance(x, str) for x in default):
            out[key] = value.split(",")
        elif isinstance(default, (list, tuple)):
            out[key] = [_number(pair, key, v, all(isinstance(x, int) for x in default)) for v in value.split(",")]
        elif isinstance(default, str):
            out[key] = value
        else:
            out[key] = _number(pair, key, value, isinstance(default, int))
        if key == "step_size" and not out[key] > 0:
            raise ValueError(f"--set {pair!r}: step_size must be > 0")
    return out


def _number(pair: str, key: str, value: str, integer: bool):
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"--set {pair!r}: {key} must be a number (or numbers separated by commas)") from None
    if integer:
        if not number.is_integer():
            raise ValueError(f"--set {pair!r}: {key} must be an integer")
        return int(number)
    return number
