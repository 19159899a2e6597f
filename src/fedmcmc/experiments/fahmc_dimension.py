"""Communication rounds against dimension (Liang et al. 2024, Section 5.2, Figure 2).

The heterogeneous Gaussian of Section 5.2 (half of the 10 clients with local posterior
N(20 1_d, I), half N(1_d, 4 I); global N(16.2 1_d, 1.6 I)), FA-HMC with K = 5, T = 10 and
eta = 0.02 / d^(1/4), started at 0. For each d we count the rounds t/T until W2^2 between the
law of theta and the posterior falls below 0.1, and fit the slope of (t/T)^2 against d.

The law of theta at round r is estimated from many independent chains. By symmetry every
coordinate has the same mean and variance and coordinates are independent, so the estimate
pools chains and coordinates: W2^2 = d [(m - 16.2)^2 + (s - sqrt(1.6))^2] with m, s^2 the
pooled mean and variance (its Monte-Carlo bias, about 1.6 / chains, is reported). Beside it,
the exact W2^2 from the law recursion (:mod:`fedmcmc.laws`); each run lasts 1.5 times the
exact number of rounds so that the crossing is observed.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from fedmcmc import io, metrics
from fedmcmc.data.synthetic import heterogeneous_local_posteriors
from fedmcmc.experiments.settings import resolve
from fedmcmc.laws import fa_hmc_law
from fedmcmc.models import gaussian_factors, gaussian_factors_posterior
from fedmcmc.samplers import fa_hmc
from fedmcmc.simulator import simulate

#: The clock of the published results (docs/reproductions.md, "FA-HMC schedules"): T counts trajectories.
CLOCK = "trajectory"
NAME = "fahmc-dimension"
SUMMARY = "FA-HMC: rounds to reach W2^2 < 0.1 against dimension, heterogeneous Gaussian (FA-HMC Fig. 2)"

FULL = dict(seed=0, dims=[1, 2, 5, 10, 20, 50, 100, 200, 500], num_leapfrog=5, local_steps=10, base_step_size=0.02,
            correlation=1.0, threshold=0.1, num_chains=200, min_rounds=100, max_rounds=20_000)
QUICK = dict(FULL, dims=[1, 2, 5, 10, 20, 50])

LAM = np.array([1.0] * 5 + [0.25] * 5)  # curvatures of the local potentials f^(c)
MU = np.array([20.0] * 5 + [1.0] * 5)
WEIGHTS = np.full(10, 0.1)


def coordinate_moments(theta):
    """Mean and mean square over coordinates: all the isotropic law needs."""
    return jnp.stack([jnp.mean(theta), jnp.mean(theta**2)])


def step_size_for(cfg: dict, d: int) -> float:
    return cfg["base_step_size"] / d**0.25


def exact_w2_squared(cfg: dict, d: int, rounds: int) -> np.ndarray:
    law = fa_hmc_law(LAM, MU, WEIGHTS, step_size_for(cfg, d), cfg["num_leapfrog"], cfg["local_steps"],
                     cfg["correlation"], rounds=rounds, clock=CLOCK)
    return d * ((law.mean[1:] - 16.2) ** 2 + (np.sqrt(law.var[1:]) - np.sqrt(1.6)) ** 2)


def fit_slope(dims, rounds) -> dict:
    """Least squares (t/T)^2 = a + b d, and the exponent of t/T = c d^alpha."""
    d, r = np.asarray(dims, float), np.asarray(rounds, float)
    ok = np.isfinite(r)
    if ok.sum() < 2:
        return {"slope": None, "intercept": None, "exponent": None}
    b, a = np.polyfit(d[ok], r[ok] ** 2, 1)
    alpha = np.polyfit(np.log(d[ok]), np.log(r[ok]), 1)[0]
    return {"slope": float(b), "intercept": float(a), "exponent": float(alpha)}


def run(out: Path, quick: bool = False, seed: int | None = None, progress: bool = True,
        resume: bool = False, settings: dict | None = None) -> dict:
    cfg = resolve(FULL, QUICK, quick, seed, settings)
    out = Path(out)
    started = time.perf_counter()
    per_d, kept = {}, {}
    for d in cfg["dims"]:
        data = heterogeneous_local_posteriors(d)
        post = gaussian_factors_posterior(data)
        if not (np.allclose(post.mean, 16.2) and math.isclose(post.var, 1.6, rel_tol=1e-6)):
            raise AssertionError(f"the Section 5.2 posterior should be N(16.2, 1.6), got {post.mean[0]}, {post.var}")
        exact = exact_w2_squared(cfg, d, cfg["max_rounds"])
        exact_rounds = metrics.rounds_to_reach(exact, cfg["threshold"])
        rounds = int(min(cfg["max_rounds"], max(cfg["min_rounds"], math.ceil(1.5 * min(exact_rounds, cfg["max_rounds"])))))
        eta = step_size_for(cfg, d)
        sampler = fa_hmc(gaussian_factors(d), data.weights, eta, cfg["num_leapfrog"], cfg["local_steps"],
                         correlation=cfg["correlation"], name=f"d={d}", clock=CLOCK)
        res = simulate(cfg["seed"], sampler, data, np.zeros(d), rounds, num_chains=cfg["num_chains"], thinning=rounds,
                       statistic=coordinate_moments, progress=progress, description=f"d={d}", resume=resume,
                       out_dir=out / "runs" / f"d{d}")
        m = res.statistics[..., 0].mean(axis=0)  # pooled over chains and coordinates, per round
        var = res.statistics[..., 1].mean(axis=0) - m**2
        w2 = d * ((m - 16.2) ** 2 + (np.sqrt(np.maximum(var, 0.0)) - np.sqrt(1.6)) ** 2)
        sampled_rounds = metrics.rounds_to_reach(w2, cfg["threshold"])
        per_d[str(d)] = {
            "step_size": eta,
            "rounds": sampled_rounds,
            "exact_rounds": exact_rounds,
            "final_w2_squared": float(w2[-1]),
            "exact_final_w2_squared": float(exact[rounds - 1]),
            "rounds_run": rounds,
            "monte_carlo_bias_of_w2_squared": 1.6 / cfg["num_chains"],
            "curve": {"w2_squared": w2[:: max(1, rounds // 200)].tolist(),
                      "exact_w2_squared": exact[:rounds:max(1, rounds // 200)].tolist(),
                      "every": max(1, rounds // 200)},
            "sampler_seconds": res.wall_seconds,
        }
        kept[f"d={d}"] = res
    dims = [int(d) for d in per_d]
    payload = {
        "experiment": NAME,
        "quick": quick,
        "settings": cfg,
        "dims": per_d,
        "fit": {"sampled": fit_slope(dims, [per_d[str(d)]["rounds"] for d in dims]),
                "exact": fit_slope(dims, [per_d[str(d)]["exact_rounds"] for d in dims])},
        "wall_seconds": time.perf_counter() - started,
    }
    io.write_json(out / "results.json", payload)
    for label, res in kept.items():  # one file per dimension: ArviZ stores runs of one shape together
        io.write_posterior(out / "runs" / label.replace("=", "") / "posterior.nc", {label: res},
                           attrs={"experiment": NAME, "quick": quick})
    plot(out / "rounds_vs_dimension.png", per_d, payload["fit"], cfg, quick)
    return payload


def plot(path: Path, per_d: dict, fit: dict, cfg: dict, quick: bool):
    fig, (ax, bx) = io.new_figure(ncols=2, figsize=(10, 4))
    dims = np.array([int(d) for d in per_d], float)
    for key, style, label in (("rounds", "o", "sampled"), ("exact_rounds", "k+", "exact law")):
        r = np.array([per_d[str(int(d))][key] for d in dims], float)
        ax.plot(dims, r**2, style, label=label)
    if fit["sampled"]["slope"] is not None:
        grid = np.linspace(0, dims.max(), 50)
        ax.plot(grid, fit["sampled"]["intercept"] + fit["sampled"]["slope"] * grid, "C0-", linewidth=0.8,
                label=f"fit: slope {fit['sampled']['slope']:.3g}")
    ax.set_xlabel("dimension d")
    ax.set_ylabel("(t / T)^2, rounds squared")
    ax.set_title(f"rounds to W2^2 < {cfg['threshold']}" + (" (quick)" if quick else ""))
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    for d in dims:
        c = per_d[str(int(d))]["curve"]
        x = np.arange(1, len(c["w2_squared"]) + 1) * c["every"]
        line, = bx.loglog(x, c["w2_squared"], linewidth=0.8, label=f"d = {int(d)}")
        bx.loglog(x, c["exact_w2_squared"], ":", color=line.get_color(), linewidth=0.8)
    bx.axhline(cfg["threshold"], color="k", linewidth=0.8)
    bx.set_xlabel("round")
    bx.set_ylabel("W2^2 (dotted: exact)")
    bx.legend(fontsize=6, ncol=2)
    bx.grid(True, which="both", alpha=0.3)
    io.save_figure(fig, path)
