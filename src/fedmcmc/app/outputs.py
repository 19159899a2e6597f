"""What a practitioner reads of a finished run: ``posterior.nc``, ``summary.json`` and three plots.

:func:`write_outputs` takes the pieces of a run (its :class:`~fedmcmc.runtime.SimulationResult`,
the model, each client's held-out ``(x, y)``, the task, the feature names and the run's
settings), computes everything first and only then writes, into the run folder:

- ``posterior.nc``: ArviZ InferenceData (:func:`fedmcmc.runtime.io.to_inference_data`): the
  posterior with named dimensions (the model's layout, or ``theta`` with the feature names as
  coordinates: ``intercept`` first for a model of one more parameter than features, the
  convention of :func:`fedmcmc.models.with_intercept`, and ``log_sigma`` last for
  :func:`fedmcmc.models.linear_regression_unknown_noise`), for the built-in ``linear`` and
  ``logistic`` models with an intercept the variables in the data's own units of
  :func:`original_scale` (``coef``, and ``sigma`` or ``odds_ratio``), ``sample_stats``
  (``step_size``, bits up and down, active clients per stored draw), the held-out points'
  ``log_likelihood`` and ``observed_data`` (with a ``client`` coordinate, so ``az.loo`` and
  ``az.waic`` run) and the settings as attributes;
- ``summary.json``: R-hat and bulk/tail ESS per coordinate of the model's parameter with the
  warnings of :func:`fedmcmc.evaluation.diagnostics.convergence` (also printed), the posterior
  table of :func:`posterior_table` (``table``), the predictive metrics per client and overall
  (accuracy, NLL, Brier, ECE for classification; RMSE, NLL, coverage of the central ``level``
  interval for regression), and the bits up and down;
- ``summary.csv``: the posterior table, also printed (its first :data:`TABLE_ROWS` rows);
- ``trace.png``, ``rank.png`` (the parameters of largest R-hat) and, for classification,
  ``reliability.png``.

All metrics use the stored draws (at most ``max_draws`` per chain), the draws ``fedmcmc
predict`` reads back. A regression target standardised by ``[data]`` is read in its own units
(:func:`fedmcmc.app.inputs.in_target_units`): held-out ``log_likelihood`` and ``observed_data``,
RMSE and NLL (the standardised log-density minus ``log s_y``; coverage is the same in both).
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from fedmcmc.app import inputs as inputs_lib
from fedmcmc.app import privacy
from fedmcmc.core import figures
from fedmcmc.data import local
from fedmcmc.evaluation import calibration, diagnostics, regression, report
from fedmcmc.evaluation.predict import pointwise_log_likelihood, predict_bma
from fedmcmc.models.linear import UNKNOWN_NOISE_NAME
from fedmcmc.runtime import io
from fedmcmc.runtime.records import SimulationResult

TASKS = ("classification", "regression")
#: The columns of the posterior table (those of ``az.summary`` at ``hdi_prob = 0.94``) and the rows printed.
TABLE_COLUMNS = ("mean", "sd", "hdi_3%", "hdi_97%", "r_hat", "ess_bulk", "ess_tail")
TABLE_ROWS = 30


def parameter_names(model, feature_names: Sequence[str] | None) -> list[str] | None:
    """Names of ``theta``'s coordinates from the features, for a model without a layout (module docstring)."""
    if model.layout is not None or feature_names is None:
        return None
    names = [str(n) for n in feature_names] + (["log_sigma"] if model.name.startswith(UNKNOWN_NOISE_NAME) else [])
    if model.dim == len(names):
        return names
    return ["intercept", *names] if model.dim == len(names) + 1 else None


def original_scale(draws: np.ndarray, model: str, scaling: local.Scaling | None = None,
                   target: local.Scaling | None = None, unknown_noise: bool = False) -> dict[str, np.ndarray]:
    """The built-in ``linear`` or ``logistic`` model's parameters in the data's own units, per draw.

    ``draws [..., d]`` start with the intercept ``b'_0`` and the slopes ``b'_j`` of standardised
    features ``(x_j - m_j) / s_j`` (``scaling``; ``m_j = 0, s_j = 1`` without) and, for linear
    regression, a target ``(y - m_y) / s_y`` (``target``; ``m_y = 0, s_y = 1`` without, and for
    logistic regression); with ``unknown_noise`` the last coordinate is ``log sigma'``. Then

        slope_j = s_y b'_j / s_j,    intercept = m_y + s_y (b'_0 - sum_j b'_j m_j / s_j),
        sigma = s_y exp(log sigma'),    odds_ratio_j = exp(slope_j),

    the intercept and slopes per unit of each feature.

    Returns
    -------
    dict
        ``coef [..., F + 1]`` (intercept first), and ``sigma [...]`` (linear with unknown noise)
        or ``odds_ratio [..., F]`` (logistic), in float64.
    """
    if model not in ("linear", "logistic"):
        raise ValueError(f'original_scale is for the built-in "linear" and "logistic" models (got {model!r})')
    draws = np.asarray(draws, np.float64)
    width = draws.shape[-1] - 1 - unknown_noise
    m, s = (np.zeros(width), np.ones(width)) if scaling is None else (np.ravel(scaling.mean), np.ravel(scaling.scale))
    m_y, s_y = (0.0, 1.0) if target is None or model == "logistic" else (float(target.mean), float(target.scale))
    if len(m) != width:
        raise ValueError(f"{width} slopes in the draws but {len(m)} scaled features; were they drawn for this data?")
    slopes = s_y * draws[..., 1:width + 1] / s
    intercept = m_y + s_y * (draws[..., 0] - np.sum(draws[..., 1:width + 1] * m / s, axis=-1))
    out = {"coef": np.concatenate([intercept[..., None], slopes], axis=-1)}
    if unknown_noise:
        out["sigma"] = s_y * np.exp(draws[..., -1])
    if model == "logistic":
        with np.errstate(over="ignore"):  # inf beyond e^709: per unit of a feature whose unit is tiny
            out["odds_ratio"] = np.exp(slopes)
    return out


def original_variables(section: Mapping, inputs) -> Callable[[np.ndarray], dict] | None:
    """``draws -> {name: (values, labels)}``: the variables of :func:`original_scale` of a
    ``[model]`` section's built-in ``linear`` or ``logistic`` with an intercept (None for any other model)."""
    name = section.get("name")
    if name not in ("linear", "logistic") or not section.get("intercept", True):
        return None
    unknown = name == "linear" and section.get("noise_scale", "unknown") == "unknown"
    scaling, target = local.scaling_from(inputs.scaling), local.scaling_from(inputs.target_scaling)
    features = inputs.feature_names

    def variables(draws):
        out = original_scale(draws, name, scaling, target, unknown)
        labels = {"coef": None if features is None else ["intercept", *features], "odds_ratio": features}
        return {k: (v, labels.get(k)) for k, v in out.items()}

    return variables


#: The largest magnitude of a draw a posterior table summarises (its square is finite in float64).
TABLE_MAX = 1e150


def posterior_table(idata, var_names: Sequence[str] | None = None, hdi_prob: float = 0.94):
    """ArviZ's ``az.summary`` of ``var_names`` (all posterior variables if None): one row per
    parameter, the columns :data:`TABLE_COLUMNS` (a pandas DataFrame). A parameter with a draw
    whose square is not finite in float64 (``|x| >`` :data:`TABLE_MAX`: an odds ratio per unit
    of a feature with a tiny unit) has no row; its ``coef`` has."""
    az = io._arviz()
    post = idata.posterior if var_names is None else idata.posterior[list(var_names)]
    for name, v in post.data_vars.items():
        finite = (np.abs(np.asarray(v.values, np.float64)) <= TABLE_MAX).all(axis=(0, 1))
        if v.ndim == 3 and not finite.all():
            post = post.isel({v.dims[2]: np.flatnonzero(finite)})
    table = az.summary(post, hdi_prob=hdi_prob, round_to="none")
    return table[list(TABLE_COLUMNS)]


def format_table(table, rows: int = TABLE_ROWS) -> str:
    """The first ``rows`` rows of a posterior table as text (4 significant digits), and how many more."""
    text = table.head(rows).to_string(float_format=lambda v: f"{v:.4g}")
    more = len(table) - rows
    return text + (f"\n... {more} more row(s) in summary.csv" if more > 0 else "")


def evaluate(model, draws: np.ndarray, test: tuple, task: str, level: float = 0.94) -> dict:
    """One client's held-out points ``test = (x, y)`` under ``draws [chain, draw, d]``: the
    pointwise ``log_likelihood [chain, draw, n]``, ``y`` and what the predictive metrics need point
    by point (``probs``, the model average's class probabilities; or a regression's ``mean``,
    ``lower``, ``upper`` and ``log_density``, :func:`fedmcmc.evaluation.regression.regression_points`).
    A Flower node computes it on its own held-out part (``evaluate`` messages); the server pools it."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} (got {task!r})")
    x, y = test
    out = {"log_likelihood": np.asarray(pointwise_log_likelihood(model, draws, (x, y))), "y": np.asarray(y)}
    if task == "classification":
        return {**out, "probs": np.asarray(predict_bma(model, draws, x))}
    mean, lower, upper, density, _ = regression.regression_points(model, draws, x, y, level)
    return {**out, "mean": np.asarray(mean), "lower": np.asarray(lower), "upper": np.asarray(upper),
            "log_density": np.asarray(density)}


def held_out(evaluations: Sequence[dict]) -> io.HeldOut:
    """The clients' held-out points and their log-likelihood, from their :func:`evaluate`."""
    return io.HeldOut(np.concatenate([e["log_likelihood"] for e in evaluations], axis=-1),
                      np.concatenate([e["y"] for e in evaluations]),
                      np.concatenate([np.full(len(e["y"]), i) for i, e in enumerate(evaluations)]))


def predictive(evaluations: Sequence[dict], task: str, num_bins: int = 15, level: float = 0.94) -> tuple[dict, list | None]:
    """``(metrics per client and overall, the clients' model-average probabilities or None)`` from
    the clients' :func:`evaluate`."""
    if task == "classification":
        probs = [e["probs"] for e in evaluations]
        metric = partial(report.classification_report, num_bins=num_bins)
        return report.by_client(metric, [(p, e["y"]) for p, e in zip(probs, evaluations)]), probs
    if task == "regression":
        draws = int(np.prod(evaluations[0]["log_likelihood"].shape[:-1]))
        metric = partial(regression.regression_metrics, level=level, num_draws=draws)
        return report.by_client(metric, [tuple(e[k] for k in ("mean", "lower", "upper", "log_density", "y"))
                                         for e in evaluations]), None
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
                  draws_only: bool = False, posterior_check: Mapping | None = None,
                  derived: Callable[[np.ndarray], Mapping] | None = None,
                  show: Callable[[str], None] | None = None, evaluations: Sequence[dict] | None = None) -> dict:
    """Write ``posterior.nc``, ``summary.json``, ``summary.csv`` and the plots of a run into ``out``
    (module docstring).

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
        tests (or evaluations), no ``log_likelihood`` group and no predictive metrics.
    feature_names, settings, step_size
        Names of the features (:func:`parameter_names`), the run's settings (attributes of the
        InferenceData and ``summary.json["settings"]``), its step size.
    max_draws, num_bins, level
        Draws stored per chain (at most; 0 or None: all), bins of the ECE and reliability diagram, level of the regression interval.
    echo
        Where the warnings are printed (default: standard error).
    show
        Where the posterior table is printed (default: standard output).
    draws_only
        Write only the draws and what is computed from them alone (``[privacy] release =
        "draws"``): no ``sample_stats`` and no bits (give no ``tests``).
    posterior_check
        The run's posterior check (:func:`fedmcmc.app.posterior.check`): in ``summary.json``, and
        its verdict as the attribute ``posterior_check_passed`` of ``posterior.nc`` (1, 0, or
        -1 when not made), so that draws that failed it are marked wherever they go.
    derived
        ``draws [chain, draw, d] -> {name: (values, labels)}``: more posterior variables
        (:func:`fedmcmc.runtime.io.to_inference_data`), e.g. :func:`original_variables`; the
        posterior table shows them instead of the model's parameter.

    Returns
    -------
    dict
        The content of ``summary.json``.
    """
    if (tests is not None or evaluations is not None) and task not in TASKS:
        raise ValueError(f"task must be one of {TASKS} to report on held-out points (got {task!r})")
    draws = io.stored_draws(result, max_draws)
    if evaluations is None and tests:
        evaluations = [evaluate(model, draws, t, task, level) for t in tests]
    held = None if not evaluations else held_out(evaluations)
    extra = None if derived is None else dict(derived(draws))
    idata = io.to_inference_data({label: result}, {**(settings or {}), **_verdict(posterior_check)}, max_draws,
                                 step_size=step_size, layout=model.layout, names=parameter_names(model, feature_names),
                                 held_out=held, derived=extra)
    conv = diagnostics.convergence(idata.posterior.drop_vars(list(extra or ())))
    table = posterior_table(idata, list(extra) if extra else None)
    metrics, probs = (None, None) if not evaluations else predictive(evaluations, task, num_bins, level)
    summary = {"sampler": label, "num_chains": int(draws.shape[0]), "num_draws": int(result.samples.shape[1]),
               "num_stored_draws": int(draws.shape[1]),
               "warnings": conv["warnings"], "convergence": conv,
               "table": [{"parameter": str(k), **{c: float(v) for c, v in row.items()}} for k, row in table.iterrows()],
               "predictive": metrics,
               **({} if posterior_check is None else {"posterior_check": posterior_check}),
               **({} if draws_only else {"bits": bits(result)}), "step_size": step_size, "settings": dict(settings or {})}
    out = Path(out)
    io.write_netcdf(out / "posterior.nc", io.posterior_only(idata) if draws_only else idata)
    io.write_json(out / "summary.json", summary)
    _write_csv(out / "summary.csv", table)
    diagnostics.plot_trace(out / "trace.png", draws, conv)
    diagnostics.plot_rank(out / "rank.png", draws, conv)
    if probs is not None:
        curves = {"all clients": (np.concatenate(probs), held.y)}
        if len(evaluations) <= 5:
            curves.update({f"client {i}": (p, e["y"]) for i, (p, e) in enumerate(zip(probs, evaluations))})
        calibration.plot_reliability(out / "reliability.png", curves, num_bins, title=f"{label}: held-out points")
    (show or print)(format_table(table))
    for line in conv["warnings"]:
        (echo or _stderr)(f"fedmcmc: warning: {line}")
    return summary


def _write_csv(path: Path, table) -> None:
    """A posterior table as CSV, atomically (the parameter labels in the first column)."""
    tmp = path.with_name(path.name + ".tmp")
    table.to_csv(tmp, index_label="parameter")
    os.replace(tmp, path)


def _verdict(posterior_check: Mapping | None) -> dict:
    """The attribute that marks stored draws with the posterior check's verdict (none without a check)."""
    if posterior_check is None:
        return {}
    return {"posterior_check_passed": {True: 1, False: 0, None: -1}[posterior_check["passed"]]}


def write_run(out, cfg: dict, built, result: SimulationResult, max_draws: int | None = io.MAX_STORED_DRAWS,
              posterior_check: Mapping | None = None, echo: Callable[[str], None] | None = None,
              show: Callable[[str], None] | None = None, evaluations: Sequence[dict] | None = None) -> dict:
    """:func:`write_outputs` for a run of ``[data]`` + ``[model]``, from what
    :func:`fedmcmc.app.config.build` returns (its ``model``, ``sampler``, ``tests``, ``inputs``
    and ``step``); the config, the inputs and the step rule are the settings (a step per client,
    DG-SGLD's, is in the settings only: ``sample_stats.step_size`` holds one number). A
    standardised target is read in its own units (:func:`fedmcmc.app.inputs.in_target_units`) and
    a built-in ``linear`` or ``logistic`` model's parameters also in the data's (:func:`original_variables`)."""
    inputs, step = built.inputs, built.step.get("value")
    draws_only = privacy.draws_only(built.privacy)
    model = inputs_lib.in_target_units(built.model, inputs)
    return write_outputs(out, result, model, label=built.sampler.name, tests=None if draws_only else built.tests,
                         evaluations=None if draws_only else evaluations,
                         task=inputs.task, feature_names=inputs.feature_names, draws_only=draws_only,
                         step_size=step if np.ndim(step) == 0 else None, max_draws=max_draws, echo=echo,
                         posterior_check=None if draws_only else posterior_check,
                         derived=original_variables(cfg["model"], inputs), show=show,
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
