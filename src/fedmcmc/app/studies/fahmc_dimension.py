"""Communication rounds against dimension (Liang et al. 2024, Section 5.2, Figure 2).

The heterogeneous Gaussian of Section 5.2 (half of the 10 clients with local posterior
N(20 1_d, I), half N(1_d, 4 I); global N(16.2 1_d, 1.6 I)), FA-HMC on the paper's leapfrog
clock: positions averaged every T = 10 leapfrog steps, momenta redrawn every K = 5 leapfrog
steps (so a round is two trajectories), eta = 0.02 / d^(1/4), rho = 1, exact gradients,
started at 0. For each d we count the rounds t_eps/T until W2^2 between the law of theta and
the posterior falls below 0.1.

Two estimates of W2^2 after each round:

* **exact** (every d in ``dims``): the law recursion of :mod:`fedmcmc.evaluation.laws`; the law is
  Gaussian, so W2^2 = d [(m - 16.2)^2 + (s - sqrt(1.6))^2] with m, s^2 the per-coordinate mean
  and variance, and there is no Monte-Carlo error. This covers the paper's grid
  d = 2, 50, 100, ..., 1000.
* **sampled** (every d in ``sample_dims``, as the paper does it): ``num_chains`` independent
  runs of the d-dimensional sampler; the same formula with the population mean and variance
  pooled over chains and coordinates (coordinates are independent and exchangeable). Its
  Monte-Carlo bias is about 1.6 / chains for every d, and its cost grows as chains x d x
  rounds, so budget limits it to the smaller dimensions (``--set sample_dims=...`` for more).
  Each run lasts ``overrun`` times the exact number of rounds so that the crossing is seen.

The paper's "we repeat the experiment 200 d(d-1)/2 times" is not a number of chains we can
read sensibly (10^8 runs at d = 1000); we use ``num_chains`` = 200 runs. We report the
exponent alpha of t_eps/T = c d^alpha (least squares on logs), the least-squares line
(t_eps/T)^2 = a + b d with its R^2, and (t_eps/T)^2 / d per d: the paper's claim is that
(t_eps/T)^2 is about proportional to d.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from fedmcmc.core import figures
from fedmcmc.evaluation import distances as metrics
from fedmcmc.data.synthetic import heterogeneous_local_posteriors
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.evaluation.laws import fa_hmc_law
from fedmcmc.models import gaussian_factors, gaussian_factors_posterior
from fedmcmc.samplers import fa_hmc

NAME = "fahmc-dimension"
SUMMARY = "FA-HMC: rounds to reach W2^2 < 0.1 against dimension, heterogeneous Gaussian (FA-HMC Fig. 2)"

FULL = dict(seed=0, dims=[2] + list(range(50, 1001, 50)), sample_dims=[2, 50, 100], num_leapfrog=5, local_steps=10,
            base_step_size=0.02, correlation=1.0, threshold=0.1, num_chains=200, overrun=1.25, min_rounds=100,
            max_rounds=60_000)
QUICK = dict(FULL, dims=[2, 20, 50, 100, 200], sample_dims=[2, 20])

LAM = np.array([1.0] * 5 + [0.25] * 5)  # curvatures of the local potentials f^(c)
MU = np.array([20.0] * 5 + [1.0] * 5)
WEIGHTS = np.full(10, 0.1)


def coordinate_moments(theta):
    """Mean and mean square over coordinates: all the isotropic law needs."""
    return jnp.stack([jnp.mean(theta), jnp.mean(theta**2)])


def step_size_for(cfg: dict, d: int) -> float:
    return cfg["base_step_size"] / d**0.25


def exact_law(cfg: dict, d: int, rounds: int):
    """The law of each coordinate of theta after rounds 0..rounds (:func:`fedmcmc.evaluation.laws.fa_hmc_law`)."""
    return fa_hmc_law(LAM, MU, WEIGHTS, step_size_for(cfg, d), cfg["num_leapfrog"], cfg["local_steps"],
                      cfg["correlation"], rounds=rounds)


def w2_squared(d: int, mean, var) -> np.ndarray:
    """W2^2 between N(mean 1_d, var I_d) and the posterior N(16.2 1_d, 1.6 I_d)."""
    mean, var = np.asarray(mean, float), np.maximum(np.asarray(var, float), 0.0)
    return d * ((mean - 16.2) ** 2 + (np.sqrt(var) - np.sqrt(1.6)) ** 2)


def fit(dims, rounds) -> dict:
    """Exponent alpha of t/T = c d^alpha, the line (t/T)^2 = a + b d (with R^2), (t/T)^2 / d."""
    d, r = np.asarray(dims, float), np.asarray(rounds, float)
    ok = np.isfinite(r)
    if ok.sum() < 2:
        return {"exponent": None, "slope": None, "intercept": None, "r_squared": None, "ratio": None}
    d, r2 = d[ok], r[ok] ** 2
    b, a = np.polyfit(d, r2, 1)
    resid = r2 - (a + b * d)
    return {"exponent": float(np.polyfit(np.log(d), np.log(r[ok]), 1)[0]), "slope": float(b),
            "intercept": float(a), "r_squared": float(1 - resid @ resid / np.sum((r2 - r2.mean()) ** 2)),
            "ratio": {str(int(x)): float(y / x) for x, y in zip(d, r2)}}


def sampled(cfg: dict, d: int, data, rounds: int, run: Run):
    """Pooled mean and variance of theta after each round from ``num_chains`` runs, and the run."""
    sampler = fa_hmc(gaussian_factors(d), data.weights, step_size_for(cfg, d), cfg["num_leapfrog"],
                     cfg["local_steps"], correlation=cfg["correlation"], name=f"d={d}")
    res = run.simulate(cfg["seed"], sampler, data, np.zeros(d), rounds, num_chains=cfg["num_chains"],
                       thinning=rounds, statistic=coordinate_moments, description=f"d={d}", folder=f"d{d}")
    m = res.statistics[..., 0].mean(axis=0)  # pooled over chains and coordinates, per round
    return m, res.statistics[..., 1].mean(axis=0) - m**2, res


def science(cfg: dict, run: Run) -> Findings:
    per_d = {}
    for d in sorted({int(x) for x in list(cfg["dims"]) + list(cfg["sample_dims"])}):
        data = heterogeneous_local_posteriors(d)
        post = gaussian_factors_posterior(data)
        if not (np.allclose(post.mean, 16.2) and math.isclose(post.var, 1.6, rel_tol=1e-6)):
            raise AssertionError(f"the Section 5.2 posterior should be N(16.2, 1.6), got {post.mean[0]}, {post.var}")
        law = exact_law(cfg, d, cfg["max_rounds"])
        exact = w2_squared(d, law.mean[1:], law.var[1:])
        exact_rounds = metrics.rounds_to_reach(exact, cfg["threshold"])
        entry = {"step_size": step_size_for(cfg, d), "exact_rounds": exact_rounds,
                 "exact_stationary_w2_squared": float(exact[-1])}
        if d in {int(x) for x in cfg["sample_dims"]}:
            rounds = int(min(cfg["max_rounds"],
                             max(cfg["min_rounds"], math.ceil(cfg["overrun"] * min(exact_rounds, cfg["max_rounds"])))))
            m, var, res = sampled(cfg, d, data, rounds, run)
            w2 = w2_squared(d, m, var)
            every = max(1, rounds // 200)
            n = cfg["num_chains"] * d  # independent draws pooled
            entry.update({
                "rounds": metrics.rounds_to_reach(w2, cfg["threshold"]),
                "rounds_run": rounds,
                "final_w2_squared": float(w2[-1]),
                "exact_final_w2_squared": float(exact[rounds - 1]),
                "final_mean": float(m[-1]), "final_var": float(var[-1]),
                "exact_final_mean": float(law.mean[rounds]), "exact_final_var": float(law.var[rounds]),
                "final_mean_se": float(np.sqrt(var[-1] / n)), "final_var_se": float(var[-1] * np.sqrt(2 / n)),
                "monte_carlo_bias_of_w2_squared": 1.6 / cfg["num_chains"],
                "curve": {"w2_squared": w2[::every].tolist(), "exact_w2_squared": exact[:rounds:every].tolist(),
                          "every": every},
                "sampler_seconds": res.wall_seconds,
            })
            # one file per dimension: ArviZ stores runs of one shape together
            run.write_posterior(f"runs/d{d}/posterior.nc", {f"d={d}": res})
        per_d[str(d)] = entry
    exact_dims = sorted(int(d) for d in cfg["dims"])
    sample_dims = sorted(int(d) for d in cfg["sample_dims"])
    fits = {"exact": fit(exact_dims, [per_d[str(d)]["exact_rounds"] for d in exact_dims]),
            "sampled": fit(sample_dims, [per_d[str(d)]["rounds"] for d in sample_dims]),
            "exact_on_sample_dims": fit(sample_dims, [per_d[str(d)]["exact_rounds"] for d in sample_dims])}
    return Findings(
        settings=cfg,
        results={
            "clock": "leapfrog",
            "dims": per_d,
            "fit": fits,
        },
        figures={"rounds_vs_dimension.png": partial(plot, per_d=per_d, fits=fits, cfg=cfg, quick=run.quick)})


def plot(path: Path, per_d: dict, fits: dict, cfg: dict, quick: bool):
    fig, (ax, bx) = figures.new_figure(ncols=2, figsize=(10, 4))
    dims = np.array([int(d) for d in per_d], float)
    exact = np.array([per_d[str(int(d))]["exact_rounds"] for d in dims], float)
    ax.plot(dims, exact**2, "k+", label="exact law")
    sd = np.array([d for d in dims if "rounds" in per_d[str(int(d))]])
    ax.plot(sd, np.array([per_d[str(int(d))]["rounds"] for d in sd], float) ** 2, "o", mfc="none",
            label=f"sampled ({cfg['num_chains']} runs)")
    f = fits["exact"]
    if f["slope"] is not None:
        grid = np.linspace(0, dims.max(), 50)
        ax.plot(grid, f["intercept"] + f["slope"] * grid, "k-", linewidth=0.8,
                label=f"fit: slope {f['slope']:.3g}, R^2 {f['r_squared']:.4f}")
    ax.set_xlabel("dimension d")
    ax.set_ylabel("(t / T)^2, rounds squared")
    ax.set_title(f"rounds to W2^2 < {cfg['threshold']}, leapfrog clock" + (" (quick)" if quick else ""))
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    for d in sd:
        c = per_d[str(int(d))]["curve"]
        x = np.arange(1, len(c["w2_squared"]) + 1) * c["every"]
        line, = bx.loglog(x, c["w2_squared"], linewidth=0.8, label=f"d = {int(d)}")
        bx.loglog(x, c["exact_w2_squared"], ":", color=line.get_color(), linewidth=0.8)
    bx.axhline(cfg["threshold"], color="k", linewidth=0.8)
    bx.set_xlabel("round")
    bx.set_ylabel("W2^2 (sampled; dotted: exact)")
    bx.legend(fontsize=6, ncol=2)
    bx.grid(True, which="both", alpha=0.3)
    figures.save_figure(fig, path)
