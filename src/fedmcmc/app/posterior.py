"""A run's yardstick: the Laplace approximation at the federated mode, the chains' starting
points drawn from it (``[run] init``), and the posterior check of the draws against it
(``[run] posterior_check``).

``[run] init`` says where the chains start:

* ``"dispersed"`` (the default where the approximation exists): each chain from
  ``N(theta*, 4 H^{-1})``, the Laplace approximation with its standard deviations doubled, so
  that chains that never leave their start, or that each settle somewhere else, disagree and
  R-hat sees it; and they start near the posterior whatever the units of the data;
* ``"mode"``: every chain at ``theta*``;
* ``"zeros"``: every chain at 0 (the default where there is no approximation: a neural
  network; and under ``[privacy]``, whose accountant covers
  starting points that do not depend on the data);
* a list of ``d`` numbers (every chain there), or ``num_chains`` such lists.

``[run] posterior_check = true`` (the default) compares the draws with the approximation
(:mod:`fedmcmc.evaluation.posterior_check`); ``false`` skips the check (and its mode search,
when nothing else needs the mode). The approximation costs the mode's search (reused when the
sampler or ``step_size = "auto"`` found it) and one round of Hessian uploads, each counted in
``results.json`` (``laplace``). It is not computed for the models of :data:`NOT_LOG_CONCAVE`,
whose posteriors are multimodal: their runs start at zero and are checked by R-hat and ESS only.
"""

from __future__ import annotations

import jax
import numpy as np

from fedmcmc.estimators import approximation, gradients
from fedmcmc.evaluation import posterior_check
from fedmcmc.runtime.settings import ConfigError, RunSettings
#: Built-in ``[model]`` names whose posterior the Laplace approximation does not describe.
NOT_LOG_CONCAVE = {"mlp", "lenet5"}
#: The stream of the run's seed that draws the dispersed starts (the chains use ``seed`` itself).
_INIT_STREAM = 0x1A17


def _run(cfg: dict) -> RunSettings:
    """The config's typed ``[run]`` (its values checked there: :class:`~fedmcmc.runtime.settings.RunSettings`)."""
    return RunSettings.from_section(cfg["run"])


def wanted(cfg: dict) -> bool:
    """Whether the run asks for the approximation (its check, or starts drawn from it)."""
    run = _run(cfg)
    return run.posterior_check or run.init in ("dispersed", "mode", None)


def not_available(cfg: dict) -> str | None:
    """Why the run has no Laplace approximation (None: it can have one)."""
    if cfg.get("model", {}).get("name") in NOT_LOG_CONCAVE:
        return f"not computed for a {cfg['model']['name']} network, whose posterior is multimodal; R-hat and ESS only"
    return None


def approximate(model, data, mode) -> tuple[approximation.Laplace | None, dict]:
    """``(approximation or None, record)`` at ``mode`` (found here when None, its search then
    counted in the record's rounds and bits), or None and why (a failed search, a Hessian that is
    not positive definite)."""
    rounds, bits = 0, 0
    try:
        if mode is None:
            mode = gradients.find_mode(model, data)
            rounds, bits = mode.rounds, mode.bits
        approx = approximation.laplace_approximation(model, data, mode)
    except ValueError as err:  # a mode search that failed, or a Hessian that is not positive definite there
        return None, {"available": False, "why": str(err)}
    return approx, {"available": True, "full": approx.full, "rounds": rounds + approx.rounds,
                    "bits": bits + approx.bits, "gradient_norm_at_mode": mode.gradient_norm}


def laplace(cfg: dict, built) -> tuple[approximation.Laplace | None, dict]:
    """``(approximation or None, record)`` of the run: the record says what it cost (rounds and bits,
    the mode's search included when it was run for it) or why there is none. The approximation the
    run's whitening was made from (``built.laplace``, :mod:`fedmcmc.app.whiten`) is reused."""
    if not wanted(cfg):
        return None, {"available": False, "why": "[run] posterior_check = false and init needs no mode"}
    why = not_available(cfg)
    if why is None:
        approx, record = built.laplace or approximate(built.model, built.federation or built.data, built.mode)
        if approx is not None:
            return approx, record
        why = record["why"]
    if _run(cfg).init in ("dispersed", "mode"):
        raise ConfigError(f"[run] init = {_run(cfg).init!r} needs the Laplace approximation at the mode, which this "
                     f"run has not: {why}; use init = \"zeros\" or give the values")
    return None, {"available": False, "why": why}


def starts(cfg: dict, dim: int, approx: approximation.Laplace | None) -> np.ndarray:
    """The chains' starting points ``[num_chains, d]`` (float32) by ``[run] init`` (module docstring)."""
    r = _run(cfg)
    chains, init = r.num_chains, r.init
    if init is None:
        init = "dispersed" if approx is not None and "privacy" not in cfg else "zeros"
    if init in ("dispersed", "mode") and "privacy" in cfg:
        raise ConfigError(f"[run] init = {init!r} starts the chains from the data's mode, which the privacy accountant does "
                     'not cover; use init = "zeros" or values under [privacy]')
    if init == "zeros":
        return np.zeros((chains, dim), np.float32)
    if init == "mode":
        return np.broadcast_to(approx.mean, (chains, dim)).astype(np.float32)
    if init == "dispersed":
        key = jax.random.fold_in(jax.random.key(r.seed), _INIT_STREAM)
        return approximation.dispersed_starts(key, approx, chains)
    try:
        values = np.asarray(init, np.float64)
    except (TypeError, ValueError):
        values = np.array(np.nan)
    if values.shape not in ((dim,), (chains, dim)) or not np.all(np.isfinite(values)):
        raise ConfigError(f"[run] init as values must be {dim} finite numbers, or {chains} lists of {dim} (got shape "
                     f"{values.shape})")
    return np.broadcast_to(values, (chains, dim)).astype(np.float32)


def check(draws: np.ndarray, approx: approximation.Laplace | None, record: dict, names=None) -> dict:
    """The posterior check's record for ``results.json`` and ``summary.json``: the check of
    :mod:`fedmcmc.evaluation.posterior_check`, or ``passed = None`` and why it was not made."""
    if approx is None:
        return {"passed": None, "why": record.get("why")}
    return posterior_check.check(draws, approx, names)


ADVICE = ('these draws are not the posterior. Try step_size = "auto" or a smaller step; for de-biased FA-HMC '
          '(debiased = true) fewer local_steps or debiased = false (docs/design.md, "The posterior check")')


def message(report: dict) -> str | None:
    """One line for the terminal: when the check failed, or was inconclusive with marginals far
    from the approximation (None otherwise)."""
    if report["passed"] is not False and not report.get("flagged"):
        return None
    more = len(report["flagged"]) - 1
    found = report["worst"] + (f" (and {more} more parameters)" if more else "")
    if report["passed"] is None:
        return (f"the posterior check is {report['why']}; meanwhile the draws are far from the Laplace approximation "
                f"({found}): if that persists in a longer run, {ADVICE}")
    return f"the posterior check failed: {found}; {ADVICE}"
