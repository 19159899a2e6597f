"""QLSD#, QLSD* and QLSD++ in the big-data regime gamma = eta / N (Vono et al., AISTATS 2022,
Section 3 "Consistency analysis in the big data regime", Table 2 last column, supplement S4).

**The paper's claim** (Corollaries S10-S12): with ``N_i = floor(c_i N)``, minibatches
``n_i = floor(c_i n)`` with ``n`` fixed, ``p_i = 1``, one ``omega`` for all, and the step size
``gamma = eta / N``, the asymptotic bias in squared 2-Wasserstein distance, ``gamma B``, is
``gamma (omega + 1) O(N) = O(1)`` for QLSD (so QLSD#): it does not vanish as N grows; it is
``gamma d (omega + 1) O(1) = O(1 / N)`` for QLSD* and QLSD++: it vanishes.

**Problem**: Gaussian means, d = ``dim``, b = ``num_clients`` clients with fixed shares ``c_i``
(``N_i ~ U{10, ..., 199}`` normalised, as the toy Gaussian) and fixed means
``mu_i ~ N(0, mean_spread^2 I)``; client ``i`` holds ``floor(c_i N)`` points ``N(mu_i, I)``
(drawn afresh for each N), flat prior: the posterior is N(ybar, I / N) exactly.

**Samplers**, for each N in ``totals`` (over more than a decade), all with the same quantiser
``C^(s)`` (``levels``), ``gamma = eta / N`` and ``n_i = max(1, floor(c_i n))``:
QLSD# (minibatch gradients), QLSD* (control variates at the mode, in closed form), QLSD++ (SVRG anchor every
``refresh_every`` rounds, memory rate ``1 / (omega + 1)``); every chain starts at the posterior
mean (no transient to wait for), ``num_chains`` chains of ``num_iterations`` rounds.

**Metric**: the bias of the second moment about the exact posterior mean,
``b_2 = E||theta - ybar||^2 - d / N`` (the posterior's value is ``d / N``), estimated by the
draws' average, with the standard error over chains; and the lower bound it gives on the
squared Wasserstein distance, ``W_2^2 >= (sqrt(E||theta - ybar||^2) - sqrt(d / N))^2`` (the
triangle inequality for W_2 through the point mass at ybar; equality for isotropic Gaussians
with the same mean). ``N b_2 / d`` is the bias relative to the posterior's spread. We also
fit the log-log slope of ``b_2`` against N for each sampler (claim: 0 for QLSD#, -1 for the
others).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.compression import quantization, quantization_omega
from fedmcmc.data.federated import from_clients
from fedmcmc.app.studies.qlsd_omega import exact_mode, loglog_slope
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models.gaussian import gaussian_mean, gaussian_mean_posterior
from fedmcmc.samplers import qlsd_pp, qlsd_sharp, qlsd_star

NAME = "qlsd-big-data"
SUMMARY = "QLSD#/QLSD*/QLSD++ with gamma = eta / N, N over 1.5 decades: bias against the exact posterior (QLSD Table 2)"

FULL = dict(seed=0, dim=5, num_clients=10, mean_spread=5.0, totals=[500, 1000, 2000, 5000, 10000, 20000], eta=0.2,
            total_batch=100, levels=4, refresh_every=100, num_iterations=5_000, burn_in=500, num_chains=8,
            methods=["QLSD#", "QLSD*", "QLSD++"])
QUICK = dict(FULL, totals=[500, 2000, 10000], num_iterations=2_000, burn_in=200, num_chains=4)

METHODS = ("QLSD#", "QLSD*", "QLSD++")
TAGS = str.maketrans({"#": "sharp", "*": "star", "+": "p"})


def client_setup(seed: int, num_clients: int, dim: int, mean_spread: float) -> tuple[np.ndarray, np.ndarray]:
    """The shares ``c_i`` (sizes U{10, ..., 199}, normalised) and means ``mu_i ~ N(0, mean_spread^2 I)``."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(10, 200, size=num_clients).astype(np.float64)
    return sizes / sizes.sum(), rng.normal(0.0, mean_spread, size=(num_clients, dim))


def clients_for(seed: int, total: int, shares, means):
    """``floor(c_i N)`` points ``N(mu_i, I)`` per client (at least one), fresh for each ``total``."""
    rng = np.random.default_rng([seed, total])
    counts = np.maximum(np.floor(np.asarray(shares) * total).astype(int), 1)
    return from_clients([rng.normal(mu, 1.0, size=(int(k), len(mu))) for k, mu in zip(counts, means)])


def science(cfg: dict, run: Run) -> Findings:
    if not 0 <= cfg["burn_in"] < cfg["num_iterations"]:
        raise ValueError(f"burn_in ({cfg['burn_in']}) must lie in [0, num_iterations = {cfg['num_iterations']})")
    if not 0 < cfg["eta"] < 1:
        raise ValueError(f"eta = gamma N must lie in (0, 1) for a stable chain (got {cfg['eta']})")
    d = int(cfg["dim"])
    shares, means = client_setup(cfg["seed"], cfg["num_clients"], d, cfg["mean_spread"])
    batch = np.maximum(np.floor(shares * cfg["total_batch"]).astype(int), 1)
    model = gaussian_mean(d, noise_scale=1.0)
    compressor = quantization(int(cfg["levels"]))

    unknown = set(cfg["methods"]) - set(METHODS)
    if unknown or not cfg["methods"]:
        raise ValueError(f"methods must be a non-empty subset of {list(METHODS)} (got {cfg['methods']!r})")
    rows = {m: [] for m in METHODS if m in cfg["methods"]}
    for total in cfg["totals"]:
        data = clients_for(cfg["seed"], int(total), shares, means)
        post = gaussian_mean_posterior(data)
        n = int(np.sum(data.counts))
        gamma = cfg["eta"] / n
        mode = exact_mode(data, post)
        centre = np.asarray(post.mean, np.float32)

        def sq_dist(theta, centre=centre):
            import jax.numpy as jnp

            return jnp.sum((theta - centre) ** 2)

        make = {"QLSD#": lambda: qlsd_sharp(model, gamma, batch, compressor, name="QLSD#"),
                "QLSD*": lambda: qlsd_star(model, gamma, mode, batch, compressor, name="QLSD*"),
                "QLSD++": lambda: qlsd_pp(model, gamma, batch, compressor, refresh_every=cfg["refresh_every"],
                                          name="QLSD++")}
        for label in rows:
            res = run.simulate(cfg["seed"], make[label](), data, centre, cfg["num_iterations"],
                               num_chains=cfg["num_chains"], burn_in=cfg["burn_in"], thinning=cfg["num_iterations"],
                               statistic=sq_dist, description=f"{label}, N={n}", folder=f"N{n}-{label.translate(TAGS)}")
            m2 = res.statistics.astype(np.float64).mean(axis=1)  # [chain]
            m, se = float(m2.mean()), float(m2.std(ddof=1) / np.sqrt(len(m2)))
            rows[label].append({"N": n, "step_size": gamma, "second_moment": m, "second_moment_se": se,
                                "posterior_second_moment": d * post.var, "bias": m - d * post.var, "bias_se": se,
                                "relative_bias": (m - d * post.var) / (d * post.var),
                                "relative_bias_se": se / (d * post.var),
                                "w2_squared_lower_bound": (np.sqrt(m) - np.sqrt(d * post.var)) ** 2,
                                "bits_per_iteration": float(res.total_bits_up.mean() / cfg["num_iterations"]),
                                "sampler_seconds": res.wall_seconds})

    fits = {}
    for label, r in rows.items():
        ok = [x for x in r if x["bias"] > 2 * x["bias_se"]]
        if len(ok) >= 2:
            slope, slope_se = loglog_slope([x["N"] for x in ok], [x["bias"] for x in ok], [x["bias_se"] for x in ok])
            fits[label] = {"slope_vs_N": slope, "slope_vs_N_se": slope_se, "points": [x["N"] for x in ok]}
        else:
            fits[label] = {"slope_vs_N": None, "points": [x["N"] for x in ok]}
    return Findings(
        settings={**cfg, "shares": shares.tolist(), "batch_sizes": batch.tolist(),
                  "omega": float(quantization_omega(int(cfg["levels"]), d))},
        results={"paper_claim": "gamma = eta / N: the W2^2 bias of QLSD# is O(1) (does not vanish); of QLSD* and "
                                "QLSD++ O(1 / N) (vanishes)",
                 "methods": rows,
                 "fits": fits},
        figures={"bias_vs_N.png": partial(plot, rows=rows, quick=run.quick)})


def plot(path: Path, rows: dict, quick: bool):
    fig, axes = figures.new_figure(ncols=2, figsize=(11, 4.2))
    for i, (label, r) in enumerate(rows.items()):
        ns = np.array([x["N"] for x in r])
        for ax, key in zip(axes, ("bias", "relative_bias")):
            y = np.array([x[key] for x in r])
            se = np.array([x[key + "_se"] for x in r])
            ax.errorbar(ns, np.abs(y), yerr=se, fmt="-o", ms=4, color=f"C{i}", label=label)
    axes[0].set_ylabel("b2 = E||theta - ybar||^2 - d / N")
    axes[1].set_ylabel("b2 / (d / N)")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("N (total points), gamma = eta / N")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Big-data regime on a Gaussian with exact posterior" + (" (quick)" if quick else ""))
    figures.save_figure(fig, path)
