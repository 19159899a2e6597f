"""Outputs that the ecosystem reads: ArviZ InferenceData (netCDF) and JSON (figures: :mod:`fedmcmc.core.figures`).

One run's InferenceData follows ArviZ's schema: ``posterior`` (one variable per named block of
the model's :class:`~fedmcmc.models.layout.ParamLayout`, else ``theta[chain, draw, theta_dim]``,
plus any variables computed from each draw, such as coefficients in the data's own units),
``sample_stats`` (``step_size`` and the bits and participations of each stored draw) and, given
held-out points (:class:`HeldOut`), ``log_likelihood`` and ``observed_data`` over an ``obs``
dimension with a ``client`` coordinate, so that ``az.loo`` and ``az.waic`` run on it.
"""

from __future__ import annotations

import json
import math
import os
import re
import warnings
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from fedmcmc.runtime import settings
from fedmcmc.runtime.records import SimulationResult


def _arviz():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


class HeldOut(NamedTuple):
    """Held-out points and their pointwise log-likelihood under the stored draws.

    Attributes
    ----------
    log_likelihood
        ``[chain, draw, obs]``: ``log p(y_i | x_i, theta)`` of every stored draw
        (:func:`stored_draws`) and held-out point.
    y
        ``[obs]``: the held-out targets (the ``observed_data``).
    client
        ``[obs]``: the client that holds each point.
    """

    log_likelihood: np.ndarray
    y: np.ndarray
    client: np.ndarray


#: Draws per chain that ``fedmcmc run`` stores in ``posterior.nc`` unless ``[run] max_stored_draws`` says otherwise.
MAX_STORED_DRAWS = settings.MAX_STORED_DRAWS


def stride(num_draws: int, max_draws: int | None) -> int:
    """Keep every ``stride``-th draw so that at most ``max_draws`` are stored (all if
    ``max_draws`` is 0 or None)."""
    return 1 if not max_draws or num_draws <= max_draws else math.ceil(num_draws / max_draws)


def stored_draws(result: SimulationResult, max_draws: int | None = None) -> np.ndarray:
    """The draws ``[chain, draw, d]`` that :func:`to_inference_data` stores (thinned evenly to
    at most ``max_draws``): the draws a :class:`HeldOut` log-likelihood is computed on."""
    step = stride(result.samples.shape[1], max_draws)
    return result.samples[:, step - 1::step]


def _window_sums(a: np.ndarray, step: int) -> np.ndarray:
    """``[chain, draw]`` per-draw counts summed over each stored draw's window of ``step`` draws."""
    kept = (a.shape[1] // step) * step
    return a[:, :kept].reshape(a.shape[0], -1, step).sum(axis=2)


def _variable_name(block: str) -> str:
    """A block name as a netCDF variable name (``dense1/w`` -> ``dense1_w``)."""
    return re.sub(r"\W", "_", block)


def posterior_variables(draws: np.ndarray, layout=None, names: Sequence[str] | None = None):
    """``(variables, dims, coords)`` of the ``posterior`` group for draws ``[chain, draw, d]``.

    With a ``layout``, one variable per block, shaped as the block, with dimensions
    ``<block>_dim_<k>``; otherwise ``theta`` with dimension ``theta_dim``, whose coordinate
    values are ``names`` (e.g. feature names) when given.
    """
    d = draws.shape[-1]
    if layout is None:
        if names is not None and len(names) != d:
            raise ValueError(f"{len(names)} parameter names for a parameter of dimension {d}")
        coords = {} if names is None else {"theta_dim": [str(n) for n in names]}
        return {"theta": draws}, {"theta": ["theta_dim"]}, coords
    if layout.dim != d:
        raise ValueError(f"the layout has dimension {layout.dim}, the draws {d}")
    variables, dims = {}, {}
    for block, sl, shape in zip(layout.names, layout.slices.values(), layout.block_shapes):
        var = _variable_name(block)
        variables[var] = draws[..., sl].reshape(draws.shape[:2] + shape)
        dims[var] = [f"{var}_dim_{k}" for k in range(len(shape))]
    return variables, dims, {}


def flat_draws(posterior, layout=None) -> np.ndarray:
    """The inverse of :func:`posterior_variables`: ``[chain, draw, d]`` from a ``posterior`` group."""
    if layout is None:
        return np.asarray(posterior["theta"].values)
    parts = [np.asarray(posterior[_variable_name(b)].values) for b in layout.names]
    return np.concatenate([p.reshape(p.shape[:2] + (-1,)) for p in parts], axis=-1)


def _per_draw_stats(r: SimulationResult, step: int) -> dict:
    return {"bits_up": _window_sums(r.bits_up, step), "bits_down": _window_sums(r.bits_down, step),
            "active_clients": _window_sums(r.active, step)}


def _one_run(r: SimulationResult, step: int, step_size, layout, names, held_out: HeldOut | None, derived):
    """The groups, dims and coords of one run's InferenceData."""
    draws = r.samples[:, step - 1::step]
    posterior, dims, coords = posterior_variables(draws, layout, names)
    for var, (values, labels) in (derived or {}).items():
        if var in posterior or np.shape(values)[:2] != draws.shape[:2] or np.ndim(values) > 3:
            raise ValueError(f"derived variable {var!r}: need a new name and values [chain, draw] or [chain, draw, k] "
                             f"for {draws.shape[:2]} stored draws (got {np.shape(values)})")
        posterior[var] = np.asarray(values)
        if np.ndim(values) == 3:
            dims[var] = [f"{var}_dim"]
            if labels is not None:
                coords[f"{var}_dim"] = [str(n) for n in labels]
    groups = {"posterior": posterior, "sample_stats": _per_draw_stats(r, step)}
    if step_size is not None:
        groups["sample_stats"]["step_size"] = np.full(draws.shape[:2], float(step_size))
    if held_out is not None:
        ll = np.asarray(held_out.log_likelihood)
        n = np.shape(held_out.y)[0]
        if ll.shape != draws.shape[:2] + (n,) or np.shape(held_out.client) != (n,):
            raise ValueError(f"held-out log-likelihood of shape {ll.shape} for {draws.shape[:2]} stored draws and "
                             f"{n} points (compute it on stored_draws(result, max_draws))")
        groups.update(log_likelihood={"y": ll}, observed_data={"y": np.asarray(held_out.y)})
        dims["y"] = ["obs"]
        coords["obs"] = np.arange(n)
    return groups, dims, coords


def _several_runs(results: Mapping[str, SimulationResult], step: int):
    """The groups, dims and coords of several runs stored along a ``method`` dimension."""
    labels = list(results)
    shapes = {results[k].samples.shape for k in labels}
    if len(shapes) != 1:
        raise ValueError(f"runs to store together must have the same [chain, draw, d] shape (got {shapes})")
    per = [_per_draw_stats(results[k], step) for k in labels]
    groups = {"posterior": {"theta": np.stack([results[k].samples[:, step - 1::step] for k in labels], axis=2)},
              "sample_stats": {name: np.stack([p[name] for p in per], axis=2) for name in per[0]}}
    dims = {"theta": ["method", "theta_dim"], **{name: ["method"] for name in per[0]}}
    return groups, dims, {"method": labels}


def to_inference_data(results: Mapping[str, SimulationResult], attrs: Mapping | None = None,
                      max_draws: int | None = None, *, step_size: float | None = None, layout=None,
                      names: Sequence[str] | None = None, held_out: HeldOut | None = None,
                      derived: Mapping[str, tuple[np.ndarray, Sequence[str] | None]] | None = None):
    """Build an ArviZ InferenceData from one or more runs.

    Parameters
    ----------
    results
        ``{label: SimulationResult}``. One run gives the groups of the module docstring. Several
        runs with the same number of chains, draws and dimensions (the methods of a study) give
        ``posterior.theta[chain, draw, method, theta_dim]`` and the ``sample_stats`` of each
        along the same ``method`` dimension.
    attrs
        The run's settings, stored as the InferenceData's attributes (``idata.attrs``;
        containers as JSON); every group's attributes name the inference library (ArviZ's schema).
    max_draws
        Thin the stored draws evenly to at most this many per chain; the thinning is recorded
        in the attributes, and the bits and participations of a stored draw are summed over the
        draws it stands for.
    step_size, layout, names, held_out
        One run only: the step size (``sample_stats.step_size``), the model's layout and the
        names of ``theta``'s coordinates (:func:`posterior_variables`), and the held-out points
        (:class:`HeldOut`, computed on :func:`stored_draws`).
    derived
        One run only: ``{name: (values, labels)}``, more posterior variables computed from the
        stored draws, ``values`` of shape ``[chain, draw]`` or ``[chain, draw, k]`` (dimension
        ``<name>_dim``, whose coordinates are ``labels`` unless None).
    """
    az = _arviz()
    first = next(iter(results.values()))
    step = stride(first.samples.shape[1], max_draws)
    if len(results) == 1:
        groups, dims, coords = _one_run(first, step, step_size, layout, names, held_out, derived)
    elif any(v is not None for v in (step_size, layout, names, held_out, derived)):
        raise ValueError("step_size, layout, names, held_out and derived describe one run; store several runs "
                         "without them")
    else:
        groups, dims, coords = _several_runs(results, step)
    coords["draw"] = first.draw_iterations[step - 1::step]
    attrs = {**(attrs or {}), "stored_thinning": step, "run_thinning": first.thinning, "burn_in": first.burn_in,
             "num_iterations": first.num_iterations}
    with warnings.catch_warnings():  # axes are explicit: many chains of few draws are not a mistake here
        warnings.filterwarnings("ignore", message="More chains")
        idata = az.from_dict(**groups, dims=dims, coords=coords, attrs={k: _attr(v) for k, v in attrs.items()})
    from fedmcmc import __version__

    for group in idata.groups():
        if held_out is not None and group in ("log_likelihood", "observed_data"):  # which client holds each point
            idata[group] = idata[group].assign_coords(client=("obs", np.asarray(held_out.client)))
        idata[group].attrs.update(inference_library="fedmcmc", inference_library_version=__version__)
    return idata


def _attr(value):
    """netCDF attributes hold numbers and strings only: bools become ints, containers JSON."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(_jsonable(value))
    return value


def posterior_only(idata):
    """``idata`` with its ``posterior`` group alone (and its attributes): no ``sample_stats``,
    no held-out points (what a privacy release may publish, docs/privacy.md)."""
    return _arviz().InferenceData(posterior=idata.posterior, attrs=dict(idata.attrs))


def write_posterior(path: str | os.PathLike, results: Mapping[str, SimulationResult],
                    attrs: Mapping | None = None, max_draws: int | None = MAX_STORED_DRAWS, **one_run: Any) -> Path:
    """Write ``posterior.nc`` (netCDF through h5netcdf) and return its path; ``one_run`` holds the
    keyword arguments of :func:`to_inference_data` that describe one run."""
    return write_netcdf(path, to_inference_data(results, attrs, max_draws, **one_run))


def read_draws(path: str | os.PathLike, layout=None) -> np.ndarray:
    """The stored draws ``[chain, draw, d]`` of a ``posterior.nc`` written for a model with ``layout``."""
    posterior = _arviz().from_netcdf(str(path)).posterior
    try:
        return flat_draws(posterior, layout)
    except KeyError as err:
        raise ValueError(f"{path} holds no posterior variable {err.args[0]!r} of this model; was it written for "
                         "another model?") from None


def write_netcdf(path: str | os.PathLike, idata) -> Path:
    """Write an InferenceData to ``path`` atomically (netCDF through h5netcdf) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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


def write_json(path: str | os.PathLike, payload: Mapping, provenance: bool = True) -> Path:
    """Write a results file as JSON, atomically.

    Parameters
    ----------
    path
        The file to write.
    payload
        What it holds (NumPy values are converted, NaN and infinities written as strings).
    provenance
        Add the key ``provenance``: the commit and machine that produced the file
        (:func:`fedmcmc.runtime.provenance.record`), unless ``payload`` has one.

    Returns
    -------
    Path
        ``path``.
    """
    if provenance and "provenance" not in payload:
        from fedmcmc.runtime import provenance as _provenance

        payload = {**payload, "provenance": _provenance.record()}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_jsonable(payload), indent=2) + "\n")
    os.replace(tmp, path)
    return path
