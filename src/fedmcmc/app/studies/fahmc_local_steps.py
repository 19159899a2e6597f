"""Communication rounds against local steps T (Liang et al. 2024, Section 5.1, Figure 1 c).

FA-HMC on the d = 1000 logistic regression of :mod:`fedmcmc.app.studies.fahmc_vs_fald` (same
data, reference and leapfrog clock: positions averaged every ``T`` leapfrog steps, the shared
momentum redrawn every ``K`` leapfrog steps, ``K = 100``, ``eta = 0.01``, noisy gradients
``sigma = 10`` with two draws per leapfrog step), for ``T`` from 1 to 100 leapfrog steps per
round.

**R_eps, online, as the paper computes it** ("for each run, we collect one sample after a fixed
number of communication rounds and calculate the MEs in an online manner"): every chain keeps
the averaged ``theta`` every ``sample_every`` rounds (the same for every ``T``), nothing is
discarded as burn-in, and after ``r`` rounds the ME of all samples so far (pooled over the
``num_chains`` chains) is computed against the NUTS reference; ``R_eps`` is the first round at
which it is at most ``eps``. The curve is evaluated at ``curve_points`` rounds spaced
geometrically, so ``R_eps`` is known to that resolution (about ``(max_rounds)^(1 / curve_points)``
relative), and ``inf`` means not reached within the run.

**What eps can be.** The online ME falls with the number of samples towards a floor set by the
sampler's bias and by the finite number of samples (``me_floor``: as many independent NUTS draws
as the run keeps score this much). The paper's ``eps ~ 0.101`` is on its own scale (its data
generator is unstated and its runs are 2e7 steps); ours are ``eps`` chosen between our curves'
start and their floor (docs/reproductions.md).

**Budget.** Each ``T`` runs ``leapfrog_budget / T`` rounds clipped to ``[min_rounds, max_rounds]``:
the same number of leapfrog steps (gradient evaluations) for every ``T`` between the clips, and
at least ``min_rounds`` rounds for large ``T`` (whose R_eps would otherwise be cut by the budget
rather than by client drift); at d = 1000 a leapfrog step costs about 0.7 ms per chain
here. Raise ``leapfrog_budget``, ``max_rounds`` and ``num_chains`` with ``--set`` to run longer.

The third panel of the figure gives the same trade-off exactly, without Monte-Carlo error: the law of FA-HMC
(leapfrog clock) on the heterogeneous Gaussian of Section 5.2 (:mod:`fedmcmc.evaluation.laws`), with W2^2
of the round-r law against the posterior.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.evaluation import distances as metrics
from fedmcmc.app.studies.fahmc_vs_fald import FULL as LOGISTIC, logistic_problem, logistic_reference, reference_floor
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.evaluation.laws import fa_hmc_law
from fedmcmc.samplers import fa_hmc

NAME = "fahmc-local-steps"
SUMMARY = "FA-HMC: communication rounds to reach a marginal error against local steps T (FA-HMC Fig. 1 c)"

_PROBLEM = ("seed", "dim", "num_points", "num_clients", "feature_scale", "correlation", "gradient_noise",
            "reference_samples", "reference_chains", "reference_warmup")
FULL = dict({k: LOGISTIC[k] for k in _PROBLEM}, step_size=0.01, num_leapfrog=100,
            local_steps=[1, 2, 5, 10, 20, 40, 70, 100], leapfrog_budget=4000, min_rounds=100, max_rounds=4000,
            sample_every=1,
            num_chains=12, eps=[0.3, 0.2, 0.15], curve_points=40,
            gaussian_dim=1, gaussian_num_leapfrog=10, gaussian_eps=0.1, gaussian_rounds=20000,
            gaussian_local_steps=[1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000])
QUICK = dict(FULL, local_steps=[1, 10, 70], leapfrog_budget=700, min_rounds=20, max_rounds=700, num_chains=4,
             curve_points=20, gaussian_local_steps=[1, 10, 100])


def rounds_for(t: int, cfg: dict) -> int:
    """Rounds run with ``t`` leapfrog steps a round: the leapfrog budget, within
    ``[min_rounds, max_rounds]``, a multiple of ``sample_every``."""
    r = min(cfg["max_rounds"], max(cfg["min_rounds"], math.ceil(cfg["leapfrog_budget"] / t)))
    return max(1, r // cfg["sample_every"]) * cfg["sample_every"]


def running_me(samples: np.ndarray, ref_sorted: np.ndarray, points: int):
    """Online ME: the ME of all samples up to sample ``s`` (``samples[chain, s, d]``, pooled
    over chains) at ``points`` values of ``s`` spaced geometrically from 1 to the last."""
    n = samples.shape[1]
    ends = np.unique(np.geomspace(1, n, min(points, n)).round().astype(int))
    return ends, np.array([metrics.marginal_error(samples[:, :s], ref_sorted, reference_sorted=True) for s in ends])


def gaussian_rounds(cfg: dict) -> dict:
    """Exact R_eps (W2^2 < eps) against T on the Section 5.2 Gaussian, from the law recursion
    (leapfrog clock)."""
    lam = np.array([1.0] * 5 + [0.25] * 5)
    mu = np.array([20.0] * 5 + [1.0] * 5)
    w = np.full(10, 0.1)
    d = cfg["gaussian_dim"]
    out = {}
    for t in cfg["gaussian_local_steps"]:
        law = fa_hmc_law(lam, mu, w, cfg["step_size"], cfg["gaussian_num_leapfrog"], t, cfg["correlation"],
                         rounds=cfg["gaussian_rounds"], clock="leapfrog")
        stat = fa_hmc_law(lam, mu, w, cfg["step_size"], cfg["gaussian_num_leapfrog"], t, cfg["correlation"],
                          clock="leapfrog")
        w2 = d * ((law.mean[1:] - 16.2) ** 2 + (np.sqrt(law.var[1:]) - np.sqrt(1.6)) ** 2)
        floor = d * np.max((stat.mean - 16.2) ** 2 + (np.sqrt(stat.var) - np.sqrt(1.6)) ** 2)
        out[str(t)] = {"rounds_to_eps": metrics.rounds_to_reach(w2, cfg["gaussian_eps"]),
                       "stationary_w2_squared": float(floor)}
    return out


def science(cfg: dict, run: Run) -> Findings:
    if any(int(t) != t or t < 1 for t in cfg["local_steps"]) or cfg["sample_every"] < 1:
        raise ValueError(f"local_steps and sample_every must be positive integers (got {cfg['local_steps']}, "
                         f"{cfg['sample_every']})")
    data, model = logistic_problem(cfg)
    ref = logistic_reference(cfg, model, data)
    ref_draws = ref.samples.reshape(-1, model.dim)
    ref_sorted = np.sort(ref_draws, axis=0)

    per_t = {}
    for t in cfg["local_steps"]:
        label = f"T={t}"
        rounds = rounds_for(t, cfg)
        sampler = fa_hmc(model, data.weights, cfg["step_size"], cfg["num_leapfrog"], t,
                         correlation=cfg["correlation"], gradient_noise=cfg["gradient_noise"], name=label,
                         clock="leapfrog")
        res = run.simulate(cfg["seed"], sampler, data, np.zeros(model.dim), rounds, num_chains=cfg["num_chains"],
                           thinning=cfg["sample_every"], description=label, folder=f"T{t}")
        samples = res.samples.reshape(cfg["num_chains"], -1, model.dim)
        ends, curve = running_me(samples, ref_sorted, cfg["curve_points"])
        curve_rounds = ends * cfg["sample_every"]
        per_t[str(t)] = {
            "rounds": rounds,
            "rounds_to_reach": {str(e): metrics.rounds_to_reach(curve, e, curve_rounds) for e in cfg["eps"]},
            "final_me": float(curve[-1]),
            "me_floor": reference_floor(ref_draws, min(samples.shape[0] * samples.shape[1], ref_draws.shape[0] // 2),
                                        cfg["seed"]),
            "curve": {"rounds": curve_rounds.tolist(), "me": curve.tolist()},
            "leapfrog_steps_per_round": t,
            "sampler_seconds": res.wall_seconds,
        }
        # runs of different lengths: one posterior file each
        run.write_posterior(f"runs/T{t}/posterior.nc", {label: res}, local_steps=t)

    gauss = gaussian_rounds(cfg)
    return Findings(
        settings={**cfg, "clock": "leapfrog", "momentum_sync": "local"},
        results={
            "reference": {"draws": int(ref_draws.shape[0]), "max_rhat": ref.rhat, "min_ess": ref.ess,
                          "cached": ref.cached},
            "local_steps": per_t,
            "gaussian_exact": gauss,
        },
        figures={"rounds_vs_local_steps.png": partial(plot, per_t=per_t, gauss=gauss, cfg=cfg, quick=run.quick)})


def plot(path: Path, per_t: dict, gauss: dict, cfg: dict, quick: bool):
    fig, (cx, ax, bx) = figures.new_figure(ncols=3, figsize=(15, 4))
    ts = [int(t) for t in per_t]
    for t in ts:
        c = per_t[str(t)]["curve"]
        cx.loglog(c["rounds"], c["me"], label=f"T = {t}")
    for e in cfg["eps"]:
        cx.axhline(e, color="grey", linewidth=0.6, linestyle=":")
    cx.set_xlabel("communication rounds")
    cx.set_ylabel(f"online ME ({cfg['num_chains']} chains pooled)")
    cx.set_title(f"d = {cfg['dim']}, K = {cfg['num_leapfrog']}, eta = {cfg['step_size']}"
                 + (" (quick)" if quick else ""))
    cx.legend(fontsize=7)
    cx.grid(True, which="both", alpha=0.3)
    for e in cfg["eps"]:
        r = [per_t[str(t)]["rounds_to_reach"][str(e)] for t in ts]
        ax.loglog(ts, [x if np.isfinite(x) else np.nan for x in r], "o-", label=f"R_eps, eps = {e}")
    ax.set_xlabel("local steps T (leapfrog steps per round)")
    ax.set_ylabel("rounds to reach eps (missing: not reached)")
    ax.set_title("rounds to reach ME = eps")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    gt = [int(t) for t in gauss]
    gr = [gauss[str(t)]["rounds_to_eps"] for t in gt]
    bx.loglog(gt, [x if np.isfinite(x) else np.nan for x in gr], "o-",
              label=f"exact R_eps (W2^2 < {cfg['gaussian_eps']})")
    bx.set_xlabel("local steps T (leapfrog steps per round)")
    bx.set_ylabel("communication rounds (missing: stationary W2^2 above eps)")
    bx.set_title(f"Section 5.2 Gaussian (exact law), K = {cfg['gaussian_num_leapfrog']}, eta = {cfg['step_size']}")
    bx.grid(True, which="both", alpha=0.3)
    bx.legend(fontsize=7)
    figures.save_figure(fig, path)
