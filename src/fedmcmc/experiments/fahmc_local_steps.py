"""Communication rounds against local steps T (Liang et al. 2024, Section 5.1, Figure 1 c).

FA-HMC with K = 100 leapfrog steps of eta = 0.01 on the logistic regression of
:mod:`fedmcmc.experiments.fahmc_vs_fald`, for T from 1 to 100 local iterations per round.
R_eps is the first round at which the marginal error of all draws so far (one averaged theta
per chain and round, pooled over chains) reaches eps: few local steps mean many rounds to
explore; many local steps mean client drift, a bias floor that eps may lie under. We report
R_eps for several eps and the error floor of each T (ME of the second half of the run).

A second panel gives the same trade-off exactly, without Monte-Carlo error: the law of FA-HMC
on the heterogeneous Gaussian of Section 5.2 (:mod:`fedmcmc.laws`), with W2^2 of the round-r
law against the posterior.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from fedmcmc import io, metrics
from fedmcmc.experiments.fahmc_vs_fald import FULL as LOGISTIC, logistic_problem, logistic_reference
from fedmcmc.experiments.settings import resolve
from fedmcmc.laws import fa_hmc_law
from fedmcmc.samplers import fa_hmc
from fedmcmc.simulator import simulate

#: The clock of the published results (docs/reproductions.md, "FA-HMC schedules"): T counts trajectories.
CLOCK = "trajectory"
NAME = "fahmc-local-steps"
SUMMARY = "FA-HMC: communication rounds to reach a marginal error against local steps T (FA-HMC Fig. 1 c)"

FULL = dict(LOGISTIC, step_size=0.01, num_leapfrog=100, local_steps=[1, 2, 5, 10, 20, 50, 100], rounds=200,
            num_chains=20, eps=[0.05, 0.1, 0.2], curve_points=40,
            gaussian_dim=1, gaussian_num_leapfrog=10, gaussian_eps=0.1, gaussian_rounds=3000,
            gaussian_local_steps=[1, 2, 5, 10, 20, 50, 100, 200])
for _key in ("step_sizes", "tuned_k", "burn_in", "gradient_noise"):
    FULL.pop(_key)
QUICK = dict(FULL, local_steps=[1, 2, 5, 10, 20, 50], rounds=60, num_chains=10, curve_points=20)


def running_me(samples: np.ndarray, reference: np.ndarray, points: int):
    """ME of all draws up to round r (pooled over chains), at ``points`` rounds."""
    rounds = samples.shape[1]
    ends = np.unique(np.linspace(1, rounds, min(points, rounds)).astype(int))
    return ends, np.array([metrics.marginal_error(samples[:, :r], reference) for r in ends])


def gaussian_rounds(cfg: dict) -> dict:
    """Exact R_eps (W2^2 < eps) against T on the Section 5.2 Gaussian, from the law recursion."""
    lam = np.array([1.0] * 5 + [0.25] * 5)
    mu = np.array([20.0] * 5 + [1.0] * 5)
    w = np.full(10, 0.1)
    d = cfg["gaussian_dim"]
    out = {}
    for t in cfg["gaussian_local_steps"]:
        law = fa_hmc_law(lam, mu, w, cfg["step_size"], cfg["gaussian_num_leapfrog"], t, cfg["correlation"],
                         rounds=cfg["gaussian_rounds"], clock=CLOCK)
        stat = fa_hmc_law(lam, mu, w, cfg["step_size"], cfg["gaussian_num_leapfrog"], t, cfg["correlation"],
                          clock=CLOCK)
        w2 = d * ((law.mean[1:] - 16.2) ** 2 + (np.sqrt(law.var[1:]) - np.sqrt(1.6)) ** 2)
        floor = d * ((stat.mean[0] - 16.2) ** 2 + (np.sqrt(stat.var[0]) - np.sqrt(1.6)) ** 2)
        out[str(t)] = {"rounds_to_eps": metrics.rounds_to_reach(w2, cfg["gaussian_eps"]),
                       "stationary_w2_squared": float(floor)}
    return out


def run(out: Path, quick: bool = False, seed: int | None = None, progress: bool = True,
        resume: bool = False, settings: dict | None = None) -> dict:
    cfg = resolve(FULL, QUICK, quick, seed, settings)
    out = Path(out)
    started = time.perf_counter()
    data, model = logistic_problem(cfg)
    ref = logistic_reference(cfg, model, data)
    ref_draws = ref.samples.reshape(-1, model.dim)

    per_t, kept = {}, {}
    for t in cfg["local_steps"]:
        label = f"T={t}"
        sampler = fa_hmc(model, data.weights, cfg["step_size"], cfg["num_leapfrog"], t,
                         correlation=cfg["correlation"], name=label, clock=CLOCK)
        res = simulate(cfg["seed"], sampler, data, np.zeros(model.dim), cfg["rounds"], num_chains=cfg["num_chains"],
                       progress=progress, description=label, resume=resume, out_dir=out / "runs" / f"T{t}")
        ends, curve = running_me(res.samples, ref_draws, cfg["curve_points"])
        half = res.samples[:, cfg["rounds"] // 2:]
        per_t[str(t)] = {
            "rounds_to_eps": {str(e): metrics.rounds_to_reach(curve, e, ends) for e in cfg["eps"]},
            "error_floor": metrics.marginal_error(half, ref_draws),
            "curve": {"rounds": ends.tolist(), "me": curve.tolist()},
            "leapfrog_steps_per_round": t * cfg["num_leapfrog"],
            "sampler_seconds": res.wall_seconds,
        }
        kept[label] = res

    gauss = gaussian_rounds(cfg)
    payload = {
        "experiment": NAME,
        "quick": quick,
        "settings": cfg,
        "reference": {"max_rhat": ref.rhat, "min_ess": ref.ess, "cached": ref.cached},
        "local_steps": per_t,
        "gaussian_exact": gauss,
        "wall_seconds": time.perf_counter() - started,
    }
    io.write_json(out / "results.json", payload)
    io.write_posterior(out / "posterior.nc", kept, attrs={"experiment": NAME, "quick": quick})
    plot(out / "rounds_vs_local_steps.png", per_t, gauss, cfg, quick)
    return payload


def plot(path: Path, per_t: dict, gauss: dict, cfg: dict, quick: bool):
    fig, (ax, bx) = io.new_figure(ncols=2, figsize=(10, 4))
    ts = [int(t) for t in per_t]
    cap = cfg["rounds"]
    for e in cfg["eps"]:
        r = [per_t[str(t)]["rounds_to_eps"][str(e)] for t in ts]
        ax.semilogx(ts, [x if np.isfinite(x) else np.nan for x in r], "o-", label=f"R_eps, eps = {e}")
        never = [t for t, x in zip(ts, r) if not np.isfinite(x)]
        if never:
            ax.semilogx(never, [cap] * len(never), "x", color=ax.lines[-1].get_color())
    ax.axhline(cap, color="grey", linewidth=0.8, linestyle=":", label=f"run length ({cap} rounds; x = not reached)")
    ax.set_xlabel("local steps T")
    ax.set_ylabel("communication rounds")
    ax.set_title(f"logistic regression, K = {cfg['num_leapfrog']}, eta = {cfg['step_size']}" + (" (quick)" if quick else ""))
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.3)
    gt = [int(t) for t in gauss]
    gr = [gauss[str(t)]["rounds_to_eps"] for t in gt]
    bx.loglog(gt, [x if np.isfinite(x) else np.nan for x in gr], "o-",
              label=f"exact R_eps (W2^2 < {cfg['gaussian_eps']})")
    never = [t for t, x in zip(gt, gr) if not np.isfinite(x)]
    if never:
        bx.loglog(never, [cfg["gaussian_rounds"]] * len(never), "x", color="C3",
                  label=f"not reached: stationary W2^2 above eps (shown at {cfg['gaussian_rounds']})")
    bx.set_xlabel("local steps T")
    bx.set_ylabel("communication rounds")
    bx.set_title(f"Section 5.2 Gaussian (exact law), K = {cfg['gaussian_num_leapfrog']}, eta = {cfg['step_size']}")
    bx.grid(True, which="both", alpha=0.3)
    bx.legend(fontsize=7)
    io.save_figure(fig, path)
