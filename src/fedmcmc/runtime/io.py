"""Outputs that the ecosystem reads: ArviZ InferenceData (netCDF) and JSON (figures: :mod:`fedmcmc.core.figures`)."""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path
from typing import Mapping

import numpy as np

from fedmcmc.runtime.records import SimulationResult


def _arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def to_inference_data(results: Mapping[str, SimulationResult], attrs: Mapping | None = None,
                      max_draws: int | None = None):
    """Build an ArviZ InferenceData from one or more runs.

    One run gives ``posterior.theta[chain, draw, theta_dim]`` and ``sample_stats`` with
    ``bits_up``, ``bits_down`` and ``active_clients`` per draw. Several runs with the same
    number of chains and draws (the methods of a study) share a ``method`` dimension.
    ``max_draws`` thins the stored draws evenly to keep the file small (the thinning is
    recorded in the attributes).
    """
    az = _arviz()
    labels = list(results)
    first = results[labels[0]]
    n_draws = first.samples.shape[1]
    step = 1 if not max_draws or n_draws <= max_draws else math.ceil(n_draws / max_draws)
    sel = slice(step - 1, None, step)
    attrs = dict(attrs or {})
    attrs.update(stored_thinning=step, run_thinning=first.thinning, burn_in=first.burn_in,
                 num_iterations=first.num_iterations)

    def stats(r: SimulationResult):
        return {"bits_up": r.bits_up[:, sel], "bits_down": r.bits_down[:, sel], "active_clients": r.active[:, sel]}

    draw_coords = first.draw_iterations[sel]
    if len(labels) == 1:
        posterior = {"theta": first.samples[:, sel]}
        sample_stats = stats(first)
        dims = {"theta": ["theta_dim"]}
        coords = {"draw": draw_coords}
    else:
        shapes = {results[k].samples.shape for k in labels}
        if len(shapes) != 1:
            raise ValueError(f"runs to store together must have the same [chain, draw, d] shape (got {shapes})")
        posterior = {"theta": np.stack([results[k].samples[:, sel] for k in labels], axis=2)}
        per = [stats(results[k]) for k in labels]
        sample_stats = {name: np.stack([p[name] for p in per], axis=2) for name in per[0]}
        dims = {"theta": ["method", "theta_dim"], **{name: ["method"] for name in sample_stats}}
        coords = {"draw": draw_coords, "method": labels}
    with warnings.catch_warnings():  # axes are explicit: many chains of few draws are not a mistake here
        warnings.filterwarnings("ignore", message="More chains")
        return az.from_dict(posterior=posterior, sample_stats=sample_stats, dims=dims, coords=coords,
                            attrs={k: _attr(v) for k, v in attrs.items()})


def _attr(value):
    """netCDF attributes hold numbers and strings only: bools become ints, containers JSON."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(_jsonable(value))
    return value


def write_posterior(path: str | os.PathLike, results: Mapping[str, SimulationResult],
                    attrs: Mapping | None = None, max_draws: int | None = 2000) -> Path:
    """Write ``posterior.nc`` (netCDF through h5netcdf) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    idata = to_inference_data(results, attrs, max_draws)
    tmp = path.with_name(path.name + ".tmp")
    idata.to_netcdf(str(tmp), engine="h5netcdf")
    os.replace(tmp, path)
    return path


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else str(value)
    if isinstance(value, np.bool_):
        return bool(value)
    return value


def write_json(path: str | os.PathLike, payload: Mapping) -> Path:
    """Write a JSON file atomically (numpy values converted; NaN/inf as strings)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
    os.replace(tmp, path)
    return path
