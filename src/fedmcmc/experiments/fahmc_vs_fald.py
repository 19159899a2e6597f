"""FA-HMC against FA-LD on simulated Bayesian logistic regression (Liang et al. 2024, Section 5.1,
Figure 1 a, b, d).

1,000 points split equally over 20 clients (:func:`fedmcmc.data.synthetic.logistic_regression_data`),
prior N(0, I). For each step size eta: FA-HMC with ``K = floor(pi / (3 eta))`` leapfrog steps
for eta <= 0.01 and K tuned over a grid (K >= 2) above; FA-LD (K = 1, learning rate eta^2 / 2);
T = 10 local iterations per round; exact gradients, and exact gradients plus N(0, 100) noise
per coordinate. Beyond the figure: de-biased FA-HMC (Algorithm B.2) and centralised
unadjusted HMC with the same eta and K (all data on one machine: what federation costs).
The metric is the marginal error ME = (1/d) sum_i W1 between the pooled draws after burn-in
and a NUTS reference (BlackJAX, cached).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from fedmcmc import io, metrics, reference
from fedmcmc.data.synthetic import logistic_regression_data
from fedmcmc.experiments.settings import resolve
from fedmcmc.models import logistic_regression
from fedmcmc.samplers import fa_hmc
from fedmcmc.simulator import DivergenceError, simulate

#: The clock of the published results (docs/reproductions.md, "FA-HMC schedules"): T counts trajectories.
CLOCK = "trajectory"
NAME = "fahmc-vs-fald"
SUMMARY = "FA-HMC vs FA-LD: marginal error against step size, exact and noisy gradients (FA-HMC Fig. 1 a, b, d)"

FULL = dict(seed=0, dim=10, num_points=1000, num_clients=20, feature_scale=0.1, local_steps=10, correlation=1.0,
            gradient_noise=10.0, step_sizes=[0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3],
            tuned_k=[2, 3, 5, 10, 20], rounds=400, burn_in=100, num_chains=20,
            reference_samples=5000, reference_chains=4, reference_warmup=1000)
QUICK = dict(FULL, step_sizes=[0.03, 0.1, 0.3], tuned_k=[3, 10], rounds=120, burn_in=40, num_chains=10)

METHODS = ("FA-HMC", "FA-LD", "De-biased FA-HMC", "Centralised uHMC")
SETTINGS = ("exact", "noisy")


def default_leapfrog(step_size: float) -> int:
    """The paper's K = floor(pi / (3 eta)): a trajectory of length about pi / 3."""
    return max(1, math.floor(math.pi / (3.0 * step_size)))


def leapfrog_grid(step_size: float, tuned: list[int]) -> list[int]:
    """K for FA-HMC: the paper's rule for eta <= 0.01, else the tuning grid (K >= 2, trajectories
    no longer than the rule's)."""
    k_rule = default_leapfrog(step_size)
    if step_size <= 0.01:
        return [k_rule]
    grid = sorted({k for k in tuned if 2 <= k <= k_rule} | ({k_rule} if k_rule >= 2 else set()))
    return grid


def logistic_problem(cfg: dict):
    data, _ = logistic_regression_data(seed=cfg["seed"], dim=cfg["dim"], num_points=cfg["num_points"],
                                       num_clients=cfg["num_clients"], feature_scale=cfg["feature_scale"])
    return data, logistic_regression(cfg["dim"])


def logistic_reference(cfg: dict, model, data) -> reference.ReferenceSamples:
    return reference.nuts(cfg["seed"], model, data, num_samples=cfg["reference_samples"],
                          num_chains=cfg["reference_chains"], num_warmup=cfg["reference_warmup"], name="fahmc-logistic")


def _check(cfg: dict):
    if not 0 <= cfg["burn_in"] < cfg["rounds"]:
        raise ValueError(f"burn_in ({cfg['burn_in']}) must lie in [0, rounds = {cfg['rounds']})")
    if any(not s > 0 for s in cfg["step_sizes"]):
        raise ValueError(f"step_sizes must be > 0 (got {cfg['step_sizes']})")


def run(out: Path, quick: bool = False, seed: int | None = None, progress: bool = True,
        resume: bool = False, settings: dict | None = None) -> dict:
    cfg = resolve(FULL, QUICK, quick, seed, settings)
    _check(cfg)
    out = Path(out)
    started = time.perf_counter()
    data, model = logistic_problem(cfg)
    ref = logistic_reference(cfg, model, data)
    ref_draws = ref.samples.reshape(-1, model.dim)
    pooled = data.pooled()
    theta0 = np.zeros(model.dim)

    runs, best, kept = [], {s: {} for s in SETTINGS}, {}
    for setting in SETTINGS:
        noise = cfg["gradient_noise"] if setting == "noisy" else 0.0
        for eta in cfg["step_sizes"]:
            grid = leapfrog_grid(eta, cfg["tuned_k"])
            plan = [("FA-LD", 1)] + [(m, k) for m in ("FA-HMC", "De-biased FA-HMC", "Centralised uHMC") for k in grid]
            for method, k in plan:
                central = method == "Centralised uHMC"
                sampler = fa_hmc(model, [1.0] if central else data.weights, eta, k, cfg["local_steps"],
                                 correlation=cfg["correlation"], gradient_noise=noise,
                                 debiased=(method == "De-biased FA-HMC"), name=method, clock=CLOCK)
                label = f"{setting}-{method}-eta{eta:g}-K{k}".replace(" ", "_")
                record = dict(setting=setting, method=method, step_size=eta, num_leapfrog=k,
                              gradient_evaluations_per_round=cfg["local_steps"] * k + 1)
                try:
                    res = simulate(cfg["seed"], sampler, pooled if central else data, theta0, cfg["rounds"],
                                   num_chains=cfg["num_chains"], burn_in=cfg["burn_in"], progress=progress,
                                   description=label, resume=resume, out_dir=out / "runs" / label)
                except DivergenceError:
                    runs.append(dict(record, me=float("inf"), diverged=True))
                    continue
                draws = res.samples.reshape(-1, model.dim)
                record.update(
                    me=metrics.marginal_error(draws, ref_draws),
                    mean_error=float(np.mean(np.abs(draws.mean(0) - ref_draws.mean(0)))),
                    sd_ratio=float(np.mean(draws.std(0) / ref_draws.std(0))),
                    upload_bits_per_round=float(res.total_bits_up.mean() / cfg["rounds"]),
                    sampler_seconds=res.wall_seconds, diverged=False)
                runs.append(record)
                if record["me"] < best[setting].get(method, {}).get("me", float("inf")):
                    best[setting][method] = record
                    kept[f"{method} ({setting})"] = res

    best_me = {s: {m: best[s][m]["me"] if m in best[s] else float("inf") for m in METHODS} for s in SETTINGS}
    floor = metrics.marginal_error(ref.samples[: ref.samples.shape[0] // 2], ref.samples[ref.samples.shape[0] // 2:])
    payload = {
        "experiment": NAME,
        "quick": quick,
        "settings": {**cfg, "total_points": data.total, "leapfrog_rule": "K = floor(pi / (3 eta)) for eta <= 0.01"},
        "reference": {"sampler": "NUTS (BlackJAX, window adaptation)", "draws": int(ref_draws.shape[0]),
                      "max_rhat": ref.rhat, "min_ess": ref.ess, "divergences": ref.divergences,
                      "seconds": ref.seconds, "cached": ref.cached, "me_between_halves": floor},
        "best_me": best_me,
        "best": best,
        "runs": runs,
        "wall_seconds": time.perf_counter() - started,
    }
    io.write_json(out / "results.json", payload)
    io.write_posterior(out / "posterior.nc", kept, attrs={"experiment": NAME, "quick": quick})
    plot(out / "me_vs_step_size.png", runs, floor, quick)
    return payload


def plot(path: Path, runs: list[dict], floor: float, quick: bool):
    fig, axes = io.new_figure(ncols=2, figsize=(10, 4), sharey=True)
    styles = {"FA-HMC": "o-", "FA-LD": "s--", "De-biased FA-HMC": "^-", "Centralised uHMC": "k:"}
    for ax, setting in zip(axes, SETTINGS):
        for method in METHODS:
            points = {}
            for r in runs:
                if r["setting"] == setting and r["method"] == method and np.isfinite(r["me"]):
                    points[r["step_size"]] = min(points.get(r["step_size"], np.inf), r["me"])
            if points:
                eta = sorted(points)
                ax.loglog(eta, [points[e] for e in eta], styles[method], label=method, markersize=4)
        ax.axhline(floor, color="grey", linewidth=0.8, linestyle="-.", label="NUTS half vs half")
        ax.set_xlabel("step size eta (FA-LD learning rate eta^2 / 2)")
        ax.set_title(f"{setting} gradients" + (" (quick)" if quick else ""))
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("marginal error ME")
    axes[0].legend(fontsize=8)
    io.save_figure(fig, path)
