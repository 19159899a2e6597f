"""The posterior check of a run: its draws against the Laplace approximation at the federated mode.

A federated SG-MCMC run can be stable, mix well (R-hat near 1) and predict well, and still
sample a law far from the posterior: a step past the sampler's accuracy region, or a
correction that diverges on heterogeneous clients, gives marginals many times too wide or
off-centre, which R-hat cannot see when every chain is wrong in the same way. What the run
already knows gives a yardstick: the mode ``theta*`` and the curvature there, the Laplace
approximation ``N(theta*, H^{-1})`` (:mod:`fedmcmc.estimators.approximation`). For every
coordinate ``i`` the check compares the draws' mean ``m_i`` and standard deviation ``s_i``
with the mode and the Laplace standard deviation ``l_i``:

* **off-centre** when ``|m_i - theta*_i| / l_i > MEAN_SDS + Z r_i / sqrt(ESS_i)``, where
  ``r_i = s_i / l_i`` and the second term is ``Z`` Monte-Carlo standard errors of the mean;
* **too wide** when ``r_i > SD_RATIO (1 + Z / sqrt(2 ESS_i))`` and **too narrow** when
  ``r_i < (1 - Z / sqrt(2 ESS_i)) / SD_RATIO`` (``1 / sqrt(2 ESS)`` is the relative
  Monte-Carlo error of a standard deviation).

``ESS_i`` is the bulk effective sample size. Those allowances mean something only for chains
that have mixed: when some R-hat exceeds :data:`MIXED_RHAT` (or there are fewer than 4 draws a
chain) the check is *inconclusive* (``passed`` None) and the run's convergence warnings are what
the user reads first. The thresholds are wide on purpose: the Laplace
approximation is not the posterior (a skewed logistic posterior has its mean a fraction of a
standard deviation from its mode), and SG-MCMC has a discretisation bias of a few percent at the
steps of ``step_size = "auto"``. What they catch is a law that is not the posterior at all
(docs/design.md, "The posterior check", gives the measurements behind them).

With a diagonal approximation (more than :data:`fedmcmc.estimators.approximation.FULL_DIM`
parameters) ``l_i`` is the conditional standard deviation, a lower bound on the marginal one:
only *too narrow* is checked against it, and *off-centre* is measured in units of
``max(l_i, s_i)``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from fedmcmc.estimators.approximation import Laplace

#: Allowed distance of a marginal mean from the mode, in Laplace standard deviations.
MEAN_SDS = 1.0
#: Allowed factor between a marginal standard deviation and the Laplace one, either way.
SD_RATIO = 1.5
#: Monte-Carlo standard errors added to each allowance.
Z = 4.0
#: Above this R-hat the chains have not mixed and the check is inconclusive (Gelman and Rubin's
#: classical bound was 1.1; convergence warnings start at 1.01).
MIXED_RHAT = 1.05


def check(draws: np.ndarray, approx: Laplace, names: Sequence[str] | None = None) -> dict:
    """Compare ``draws [chain, draw, d]`` with the Laplace approximation ``approx`` (module docstring).

    Returns
    -------
    dict
        ``passed`` (None: inconclusive, ``why`` says why); ``yardstick`` (``"laplace"`` or ``"laplace-diagonal"``); ``thresholds``;
        ``parameters``: per coordinate ``{mean, sd, mode, laplace_sd, mean_offset_sds, sd_ratio,
        ess_bulk, problems}``; ``flagged``: the labels of the coordinates with a problem, worst
        first; ``worst``: one line on the worst of them (None when passed).
    """
    from fedmcmc.evaluation.diagnostics import ess, rhat

    draws = np.asarray(draws, np.float64)
    d = draws.shape[-1]
    names = [f"theta[{i}]" for i in range(d)] if names is None else [str(n) for n in names]
    flat = draws.reshape(-1, d)
    mean, sd = flat.mean(axis=0), flat.std(axis=0)
    enough = draws.shape[1] >= 4
    n_eff = np.maximum(np.nan_to_num(ess(draws), nan=1.0), 1.0) if enough else np.ones(d)
    worst_rhat = float(np.nanmax(np.nan_to_num(rhat(draws), nan=np.inf))) if enough else float("inf")
    scale = approx.sd if approx.full else np.maximum(approx.sd, sd)
    offset = np.abs(mean - approx.mean) / scale
    ratio = sd / approx.sd
    mc = Z / np.sqrt(n_eff)
    off_centre = offset > MEAN_SDS + mc * sd / scale
    too_wide = approx.full & (ratio > SD_RATIO * (1 + mc / np.sqrt(2)))
    too_narrow = ratio < (1 - mc / np.sqrt(2)) / SD_RATIO
    badness = np.maximum(offset / MEAN_SDS, np.maximum(ratio, 1 / np.maximum(ratio, 1e-300)) / SD_RATIO)
    params, flagged = {}, []
    for i, label in enumerate(names):
        problems = [p for p, bad in (("off-centre", off_centre[i]), ("too wide", too_wide[i]),
                                     ("too narrow", too_narrow[i])) if bad]
        params[label] = {"mean": mean[i], "sd": sd[i], "mode": approx.mean[i], "laplace_sd": approx.sd[i],
                         "mean_offset_sds": offset[i], "sd_ratio": ratio[i], "ess_bulk": n_eff[i], "problems": problems}
    order = np.argsort(-badness, kind="stable")
    flagged = [names[i] for i in order if params[names[i]]["problems"]]
    worst = None
    if flagged:
        p = params[flagged[0]]
        worst = (f"{flagged[0]}: mean {p['mean']:.4g} is {p['mean_offset_sds']:.3g} Laplace sds from the mode "
                 f"{p['mode']:.4g}, sd {p['sd']:.3g} is {p['sd_ratio']:.3g} x the Laplace sd {p['laplace_sd']:.3g}")
    mixed = worst_rhat <= MIXED_RHAT
    why = None if mixed else (f"inconclusive: the chains have not mixed (max R-hat {worst_rhat:.3g} > {MIXED_RHAT}); "
                              "run longer first")
    return {"passed": (not flagged) if mixed else None, "why": why,
            "yardstick": "laplace" if approx.full else "laplace-diagonal",
            "thresholds": {"mean_sds": MEAN_SDS, "sd_ratio": SD_RATIO, "monte_carlo_z": Z, "mixed_r_hat": MIXED_RHAT},
            "max_r_hat": worst_rhat, "parameters": params, "flagged": flagged, "worst": worst}
