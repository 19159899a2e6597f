"""QLSD toy Gaussian study (Vono et al., AISTATS 2022, Section 4, Figure 1 bottom).

b = 20 clients, d = 50, N_i ~ U{10, ..., 199}, client means N(0, 5^2 I), unit noise, flat
prior: the posterior is N(xbar, I / N) in closed form. Methods: QLSD# 4 and 16 bits
(minibatches of n_i = floor(N_i / 10)), QLSD* 4, 8 and 16 bits and LSD* (control variates at
theta*); 30 chains each, K = 500,000 rounds, the last 50,000 kept. The metric is the MSE of
the running average of f(theta) = ||theta|| against its exact posterior expectation,
plotted against the bits uploaded.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.estimators import gradients
from fedmcmc.app import problems
from fedmcmc.compression import qsgd_bits_bound, quantization
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models.gaussian import GaussianPosterior
from fedmcmc.samplers import lsd_star, qlsd_sharp, qlsd_star

NAME = "qlsd-toy-gaussian"
SUMMARY = "QLSD#/QLSD*/LSD* on the heterogeneous Gaussian: MSE of E||theta|| against bits (QLSD Fig. 1)"

FULL = dict(num_iterations=500_000, keep=50_000, num_chains=30, step_size=4.9e-4, seed=0, curve_points=50)
QUICK = dict(num_iterations=20_000, keep=10_000, num_chains=30, step_size=4.9e-4, seed=0, curve_points=20)

METHODS = [  # (legend label, kind, bits p or None)
    ("QLSD# 4 bits", "sharp", 4),
    ("QLSD# 16 bits", "sharp", 16),
    ("QLSD* 4 bits", "star", 4),
    ("QLSD* 8 bits", "star", 8),
    ("QLSD* 16 bits", "star", 16),
    ("LSD*", "star", None),
]


def _norm(theta):
    import jax.numpy as jnp

    return jnp.linalg.norm(theta)


def stationary_ula_posterior(post: GaussianPosterior, step_size: float) -> GaussianPosterior:
    """Stationary law of full-gradient ULA on N(mu, v I): the same mean and variance
    2 gamma / (1 - (1 - gamma / v)^2) = 2 v / (2 - gamma / v) (requires gamma < 2 v)."""
    ratio = step_size / post.var
    if ratio >= 2:
        raise ValueError(f"full-gradient ULA is unstable for step_size >= 2 v = {2 * post.var:.3g}")
    return GaussianPosterior(post.mean, 2 * post.var / (2 - ratio))


def running_mse(stats: np.ndarray, target: float, points: int) -> tuple[np.ndarray, np.ndarray]:
    """MSE over chains of the running mean of ``stats[chain, t]`` at ``points`` checkpoints."""
    n = stats.shape[1]
    ends = np.unique(np.linspace(n / points, n, points).astype(int))
    csum = np.cumsum(stats.astype(np.float64), axis=1)
    means = csum[:, ends - 1] / ends
    return ends, np.mean((means - target) ** 2, axis=0)


def science(cfg: dict, run: Run) -> Findings:
    if not 0 < cfg["keep"] <= cfg["num_iterations"]:
        raise ValueError(f"keep ({cfg['keep']}) must lie in (0, num_iterations = {cfg['num_iterations']}]")
    data, model, post = problems.heterogeneous_gaussian()
    truth = post.expected_norm()
    ula = stationary_ula_posterior(post, cfg["step_size"])
    batch = np.maximum(np.asarray(data.counts) // 10, 1)
    mode = gradients.find_mode(model, data)
    d, b = model.dim, data.num_clients
    burn_in = cfg["num_iterations"] - cfg["keep"]

    results, methods = {}, {}
    for label, kind, p in METHODS:
        compressor = quantization(2**p) if p else None
        if kind == "sharp":
            sampler = qlsd_sharp(model, cfg["step_size"], batch, compressor, name=label)
        elif p:
            sampler = qlsd_star(model, cfg["step_size"], mode, batch, compressor, name=label)
        else:
            sampler = lsd_star(model, cfg["step_size"], mode, batch, name=label)
        res = run.simulate(cfg["seed"], sampler, data, np.zeros(d), cfg["num_iterations"],
                           num_chains=cfg["num_chains"], burn_in=burn_in, thinning=10, statistic=_norm,
                           description=label, folder=label.replace(" ", "_").replace("#", "sharp").replace("*", "star"))
        results[label] = res
        estimates = res.statistics.mean(axis=1)
        ends, curve = running_mse(res.statistics, truth, cfg["curve_points"])
        bits_per_iteration = float(res.total_bits_up.mean() / cfg["num_iterations"])
        methods[label] = {
            "mse": float(np.mean((estimates - truth) ** 2)),
            "bias2": float((estimates.mean() - truth) ** 2),
            "variance": float(estimates.var()),
            "mse_vs_ula_stationary": float(np.mean((estimates - ula.expected_norm()) ** 2)),
            "upload_bits": float(res.total_bits_up.mean()),
            "bits_per_iteration": bits_per_iteration,
            "bits_per_iteration_bound": (b * qsgd_bits_bound(2**p, d) if p else 32.0 * d * b),
            "curve": {"kept_iterations": ends.tolist(),
                      "upload_bits": ((burn_in + ends) * bits_per_iteration).tolist(),
                      "mse": curve.tolist()},
            "sampler_seconds": res.wall_seconds,
        }

    return Findings(
        settings={**cfg, "num_clients": b, "dim": d, "total_points": data.total, "burn_in": burn_in,
                  "batch_sizes": batch.tolist(), "test_function": "||theta||"},
        results={"truth": {"posterior_expected_norm": truth, "posterior_variance": post.var,
                           "ula_stationary_expected_norm": ula.expected_norm(), "ula_stationary_variance": ula.var,
                           "gamma_times_L": cfg["step_size"] / post.var},
                 "theta_star": {"rounds": mode.rounds, "bits": mode.bits, "gradient_norm": mode.gradient_norm},
                 "methods": methods},
        posterior=results,
        figures={"mse_vs_bits.png": partial(plot, methods=methods, quick=run.quick,
                                            floor=(ula.expected_norm() - truth) ** 2)})


def plot(path: Path, methods: dict, quick: bool, floor: float):
    fig, ax = figures.new_figure(figsize=(6, 4))
    for label, m in methods.items():
        ax.loglog(m["curve"]["upload_bits"], m["curve"]["mse"], label=label,
                  linestyle="--" if label.startswith("QLSD#") else "-")
    ax.axhline(floor, color="k", linestyle=":", linewidth=1,
               label="bias$^2$ of full-gradient ULA at this step size")
    ax.set_xlabel("bits uploaded per chain")
    ax.set_ylabel("MSE of the estimate of E||theta||")
    ax.set_title("QLSD toy Gaussian" + (" (quick)" if quick else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    figures.save_figure(fig, path)
