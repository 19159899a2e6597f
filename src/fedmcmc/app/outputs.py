"""What a practitioner reads of a finished run: ``posterior.nc``, ``summary.json`` and three plots.

:func:`write_outputs` takes the pieces of a run (its :class:`~fedmcmc.runtime.SimulationResult`,
the model, each client's held-out ``(x, y)``, the task, the feature names and the run's
settings), computes everything first and only then writes, into the run folder:

- ``posterior.nc``: ArviZ InferenceData (:func:`fedmcmc.runtime.io.to_inference_data`): the
  posterior with named dimensions (the model's layout, or ``theta`` with the feature names as
  coordinates: ``intercept`` first for a model of one more parameter than features, the
  convention of :func:`fedmcmc.models.with_intercept`), ``sample_stats`` (``step_size``, bits
  up and down, active clients per stored draw), the held-out points' ``log_likelihood`` and
  ``observed_data`` (with a ``client`` coordinate, so ``az.loo`` and ``az.waic`` run) and the
  settings as attributes;
- ``summary.json``: R-hat and bulk/tail ESS per parameter with the warnings of
  :func:`fedmcmc.evaluation.diagnostics.convergence` (also printed), the predictive metrics per
  client and overall (accuracy, NLL, Brier, ECE for classification; RMSE, NLL, coverage of the
  central ``level`` interval for regression), and the bits up and down;
- ``trace.png``, ``rank.png`` (the parameters of largest R-hat) and, for classification,
  ``reliability.png``.

All metrics use the stored draws (at most ``max_draws`` per chain), the draws ``fedmcmc
predict`` reads back.
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from fedmcmc.app import privacy
from fedmcmc.core import figures
from fedmcmc.evaluation import calibration, diagnostics, regression, report
from fedmcmc.evaluation.predict import pointwise_log_likelihood, predict_bma
from fedmcmc.runtime import io
from fedmcmc.runtime.records import SimulationResult

TASKS = ("classification", "regression")


def parameter_names(model, feature_names: Sequence[str] | None) -> list[str] | None:
    """Names of ``theta``'s coordinates from the features, for a model without a layout (module docstring)."""
    if model.layout is not None or feature_names is None:
        return None
    names = [str(n) for n in feature_names]
    if model.dim == len(names):
        return names
    return ["intercept", *names] if model.dim == len(names) + 1 else None


def held_out(model, draws: np.ndarray, tests: Sequence[tuple]) -> io.HeldOut:
    """The clients' held-out points and their log-likelihood under ``draws [chain, draw, d]``."""
    ll = [pointwise_log_likelihood(model, draws, (x, y)) for x, y in tests]
    return io.HeldOut(np.concatenate(ll, axis=-1), np.concatenate([np.asarray(y) for _, y in tests]),
                      np.concatenate([np.full(len(y), i) for i, (_, y) in enumerate(tests)]))


def predictive(model, draws: np.ndarray, tests: Sequence[tuple], task: str, num_bins: int = 15,
               level: float = 0.94) -> tuple[dict, list | None]:
    """``(metrics per client and overall, the clients' model-average probabilities or None)``."""
    if task == "classification":
        probs = [predict_bma(model, draws, x) for x, _ in tests]
        metric = partial(report.classification_report, num_bins=num_bins)
        return report.by_client(metric, [(p, y) for p, (_, y) in zip(probs, tests)]), probs
    if task == "regression":
        return report.by_client(partial(regression.regression_report, model, draws, level=level), list(tests)), None
    raise ValueError(f"task must be one of {TASKS} (got {task!r})")


def bits(result: SimulationResult) -> dict:
    """Bits up and down per chain (the whole run: setup exchange and burn-in included) and per round."""
    up, down = float(result.total_bits_up.mean()), float(result.total_bits_down.mean())
    return {"up_per_chain": up, "down_per_chain": down, "up_per_round": up / result.num_iterations,
            "down_per_round": down / result.num_iterations}


def write_outputs(out, result: SimulationResult, model, *, label: str = "run", tests: Sequence[tuple] | None = None,
                  task: str | None = None, feature_names: Sequence[str] | None = None,
                  settings: Mapping | None = None, step_size: float | None = None, max_draws: int | None = io.MAX_STORED_DRAWS,
                  num_bins: int = 15, level: float = 0.94, echo: Callable[[str], None] | None = None,
                  draws_only: bool = False, posterior_check: Mapping | None = None) -> dict:
    """Write ``posterior.nc``, ``summary.json`` and the plots of a run into ``out`` (module docstring).

    Parameters
    ----------
    out
        The run folder.
    result, model
        The run and its model.
    label
        The run's name (the sampler's).
    tests, task
        Each client's held-out ``(x, y)`` and ``"classification"`` or ``"regression"``; without
        tests, no ``log_likelihood`` group and no predictive metrics.
    feature_names, settings, step_size
        Names of the features (:func:`parameter_names`), the run's settings (attributes of the
        InferenceData and ``summary.json["settings"]``), its step size.
    max_draws, num_bins, level
        Draws stored per chain (at most; 0 or None: all), bins of the ECE and reliability diagram, level of the regression interval.
    echo
        Where the warnings are printed (default: standard error).
    draws_only
        Write only the draws and what is computed from them alone (``[privacy] release =
        "draws"``): no ``sample_stats`` and no bits (give no ``tests``).
    posterior_check
        The run's posterior check (:func:`fedmcmc.app.posterior.check`): in ``summary.json``, and
        its verdict as the attribute ``posterior_check_passed`` of ``posterior.nc`` (1, 0, or
        -1 when not made), so that draws that failed it are marked wherever they go.

    Returns
    -------
    dict
        The content of ``summary.json``.
    """
    if tests is not None and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} to report on held-out points (got {task!r})")
    draws = io.stored_draws(result, max_draws)
    held = None if not tests else held_out(model, draws, tests)
    idata = io.to_inference_data({label: result}, {**(settings or {}), **_verdict(posterior_check)}, max_draws,
                                 step_size=step_size, layout=model.layout, names=parameter_names(model, feature_names),
                                 held_out=held)
    conv = diagnostics.convergence(idata)
    metrics, probs = (None, None) if not tests else predictive(model, draws, tests, task, num_bins, level)
    summary = {"sampler": label, "num_chains": int(draws.shape[0]), "num_draws": int(result.samples.shape[1]),
               "num_stored_draws": int(draws.shape[1]),
               "warnings": conv["warnings"], "convergence": conv, "predictive": metrics,
               **({} if posterior_check is None else {"posterior_check": posterior_check}),
               **({} if draws_only else {"bits": bits(result)}), "step_size": step_size, "settings": dict(settings or {})}
    out = Path(out)
    io.write_netcdf(out / "posterior.nc", io.posterior_only(idata) if draws_only else idata)
    io.write_json(out / "summary.json", summary)
    diagnostics.plot_trace(out / "trace.png", draws, conv)
    diagnostics.plot_rank(out / "rank.png", draws, conv)
    if probs is not None:
        curves = {"all clients": (np.concatenate(probs), held.y)}
        if len(tests) <= 5:
            curves.update({f"client {i}": (p, y) for i, (p, (_, y)) in enumerate(zip(probs, tests))})
        calibration.plot_reliability(out / "reliability.png", curves, num_bins, title=f"{label}: held-out points")
    for line in conv["warnings"]:
        (echo or _stderr)(f"fedmcmc: warning: {line}")
    return summary


def _verdict(posterior_check: Mapping | None) -> dict:
    """The attribute that marks stored draws with the posterior check's verdict (none without a check)."""
    if posterior_check is None:
        return {}
    return {"posterior_check_passed": {True: 1, False: 0, None: -1}[posterior_check["passed"]]}


def write_run(out, cfg: dict, built, result: SimulationResult, max_draws: int | None = io.MAX_STORED_DRAWS,
              posterior_check: Mapping | None = None,
              echo: Callable[[str], None] | None = None) -> dict:
    """:func:`write_outputs` for a run of ``[data]`` + ``[model]``, from what
    :func:`fedmcmc.app.config.build` returns (its ``model``, ``sampler``, ``tests``, ``inputs``
    and ``step``); the config, the inputs and the step rule are the settings (a step per client,
    DG-SGLD's, is in the settings only: ``sample_stats.step_size`` holds one number)."""
    inputs, step = built.inputs, built.step.get("value")
    draws_only = privacy.draws_only(built.privacy)
    return write_outputs(out, result, built.model, label=built.sampler.name, tests=None if draws_only else built.tests,
                         task=inputs.task, feature_names=inputs.feature_names, draws_only=draws_only,
                         step_size=step if np.ndim(step) == 0 else None, max_draws=max_draws, echo=echo,
                         posterior_check=None if draws_only else posterior_check,
                         settings=privacy.released(built.privacy, {"config": cfg, "inputs": inputs._asdict(),
                                                                   "step": built.step, **privacy.attrs(built.privacy)}))


def write_problem_run(out, cfg: dict, built, result: SimulationResult,
                      max_draws: int | None = io.MAX_STORED_DRAWS, posterior_check: Mapping | None = None) -> None:
    """``posterior.nc`` and ``trace.png`` (against the exact posterior) of a ``[problem]`` run;
    under ``[privacy] release = "draws"`` the posterior group alone, and no exact posterior."""
    attrs = privacy.released(built.privacy, {"config": cfg, **privacy.attrs(built.privacy),
                                             **_verdict(posterior_check)})
    idata = io.to_inference_data({built.sampler.name: result}, attrs, max_draws)
    draws_only = privacy.draws_only(built.privacy)
    io.write_netcdf(Path(out) / "posterior.nc", io.posterior_only(idata) if draws_only else idata)
    plot_against_exact(Path(out) / "trace.png", result.samples, None if draws_only else built.exact)


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")


def plot_against_exact(path, samples: np.ndarray, exact) -> None:
    """Trace and histogram of ``theta[0]`` against the exact posterior of a ``[problem]`` (None: without it)."""
    fig, axes = figures.new_figure(ncols=2, figsize=(9, 3.2))
    for c in range(samples.shape[0]):
        axes[0].plot(samples[c, :, 0], lw=0.6)
    if exact is not None:
        axes[0].axhline(exact.mean[0], color="k", ls="--", lw=1)
    axes[0].set_title("trace of theta[0] per chain")
    axes[0].set_xlabel("draw")
    axes[1].hist(samples[..., 0].ravel(), bins=50, density=True, alpha=0.7)
    grid = np.linspace(samples[..., 0].min(), samples[..., 0].max(), 200)
    if exact is not None:
        axes[1].plot(grid, np.exp(-0.5 * (grid - exact.mean[0]) ** 2 / exact.var) / np.sqrt(2 * np.pi * exact.var),
                     "k--")
    axes[1].set_title("theta[0]: samples" + ("" if exact is None else " vs exact posterior"))
    figures.save_figure(fig, path)
