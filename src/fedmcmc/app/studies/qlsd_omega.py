"""QLSD*: the step size against the compression variance omega on the toy Gaussian (Vono et al.,
AISTATS 2022, supplement S5.1, Figure S2).

The paper's claim (S5.1, "Discretisation step-size and compression trade-off"): the bits saved
by compression can be increased by lowering gamma, because the asymptotic bias of QLSD* is of
order ``omega O(gamma)`` (Table 1). So the part of the bias due to compression should grow like
``omega`` (log-log slope 1 against omega; 2 for an MSE, the square of a bias) and like ``gamma``.

**Problem**: the toy Gaussian of ``qlsd-toy-gaussian`` (b = 20, d = 50, ``sum N_i = 2042``, unit
noise, flat prior): the posterior is N(theta*, I / N), ``theta* = xbar``, ``N = sum N_i``.

**QLSD* on it, exactly.** ``grad U_ij(theta) - grad U_ij(theta*) = theta - theta*`` for every
datum, so every client's control-variate gradient is ``N_i x`` with ``x = theta - theta*``,
whatever its minibatch, and the quantiser is scale-invariant: with ``C_i`` independent copies
of ``C^(s)``,

    x_{k+1} = x_k - gamma sum_i N_i C_i(x_k) + sqrt(2 gamma) Z_{k+1}.

Since ``E C(x) = x`` and ``E||C(x) - x||^2 = ||x||^2 kappa(x / ||x||)``,
``kappa(u) = s^-2 sum_j f_j (1 - f_j)``, ``f_j = frac(s |u_j|)``, the second moment
``m_k = E||x_k||^2`` follows

    m_{k+1} = (1 - gamma N)^2 m_k + gamma^2 sum_i N_i^2 E[||x_k||^2 kappa(x_k / ||x_k||)] + 2 gamma d.

If the direction of ``x`` is uniform on the sphere and independent of ``||x||`` (true for the
isotropic Gaussian the chain approaches as gamma -> 0; the chain's law is exchangeable and
sign-symmetric across coordinates but not exactly rotation-invariant), the expectation is
``m_k kappa_bar(s)``, ``kappa_bar = E_u kappa(u)`` (computed here by Monte Carlo over the sphere,
with its standard error), and the stationary second moment is

    m(omega, gamma) = 2 gamma d / [1 - (1 - gamma N)^2 - gamma^2 sum_i N_i^2 kappa_bar(s)]

(:func:`stationary_second_moment`). For ``kappa_bar = 0`` it is LSD* (= full-gradient ULA here),
exactly. The compression part of the bias is ``Delta = m(omega, gamma) - m(0, gamma)``; the bias
of ``E||theta||`` is that of N(theta*, m / d I) against the posterior (Fig. 1's test function).
Long chains with the project's ``qlsd_star`` / ``lsd_star`` (same seeds, so the Langevin noise is
shared and ``Delta`` is estimated from paired chains) check the closed form where its effect is
large enough to measure (``mc_step_sizes``, ``mc_levels``).

``kappa_bar <= omega`` always (QSGD Lemma 3.1); ``kappa_bar = omega / 6`` when ``s >= sqrt(d)``
(``omega = d / s^2``, the ``f_j`` are then nearly uniform), and it rises towards ``2 omega / 3`` at
``s = 1`` (``omega = sqrt(d) / s``), so the slope against omega is 1 in the first regime and
steeper in the second; both are reported.

Outputs: ``kappa_bar``, ``m``, ``Delta``, the squared bias of ``E||theta||`` for every (s, gamma),
the fitted log-log slopes of ``Delta`` against omega (per gamma) and against gamma (per s), with
standard errors (from the regression's residuals for the closed form; weighted by the chains'
standard errors for the simulations).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.estimators import gradients
from fedmcmc.app import problems
from fedmcmc.compression import quantization, quantization_omega
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models.gaussian import GaussianPosterior
from fedmcmc.samplers import lsd_star, qlsd_star

NAME = "qlsd-omega"
SUMMARY = ("QLSD* on the toy Gaussian: bias against omega for several step sizes, closed-form second moment "
           "(uniform-direction approximation) + chains (QLSD Fig. S2)")

FULL = dict(seed=0, levels=[1, 2, 4, 8, 16, 32, 64, 256], step_sizes=[4.9e-4, 1.5e-4, 4.9e-5, 1.5e-5, 4.9e-6],
            sphere_draws=100_000, mc_step_sizes=[4.9e-4, 4.9e-5], mc_levels=[1, 2, 4, 8, 16], num_iterations=8_000,
            burn_in=500, num_chains=8)
QUICK = dict(FULL, sphere_draws=20_000, mc_step_sizes=[4.9e-4], mc_levels=[1, 4, 16], num_iterations=4_000,
             burn_in=500, num_chains=4)


def kappa_bar(levels: int, d: int, draws: int, seed: int = 0) -> tuple[float, float]:
    """``E_u[s^-2 sum_j f_j (1 - f_j)]``, ``f_j = frac(s |u_j|)``, u uniform on the unit sphere of R^d:
    the mean variance factor of ``C^(s)``, ``E||C(u) - u||^2``; Monte Carlo estimate and its s.e."""
    rng = np.random.default_rng(seed)
    kappa = np.empty(draws)
    for start in range(0, draws, 10_000):
        g = rng.standard_normal((min(10_000, draws - start), d))
        r = levels * np.abs(g) / np.linalg.norm(g, axis=1, keepdims=True)
        f = r - np.floor(r)
        kappa[start:start + len(g)] = np.sum(f * (1 - f), axis=1) / levels**2
    return float(kappa.mean()), float(kappa.std(ddof=1) / np.sqrt(draws))


def exact_mode(data, post: GaussianPosterior) -> gradients.ModeResult:
    """theta* of the Gaussian-mean model with a flat prior, in closed form: the posterior mean, where
    ``sum_i grad U_i(theta*) = sum_i sum_j (theta* - x_ij)`` vanishes (computed in float64; no rounds)."""
    theta = np.asarray(post.mean, np.float64)
    grads = sum(np.sum(theta - np.asarray(data.unpadded(i), np.float64), axis=0) for i in range(data.num_clients))
    return gradients.ModeResult(theta.astype(np.float32), grads, float(np.linalg.norm(grads)), 0, 0)


def stationary_second_moment(step_size: float, sizes, kappa: float, d: int) -> float:
    """``m = 2 gamma d / [1 - (1 - gamma N)^2 - gamma^2 sum_i N_i^2 kappa]``, the stationary
    ``E||theta - theta*||^2`` of QLSD* on the toy Gaussian (module docstring); ``kappa = 0`` is LSD*."""
    n = np.asarray(sizes, np.float64)
    denom = 1 - (1 - step_size * n.sum()) ** 2 - step_size**2 * np.sum(n**2) * kappa
    if denom <= 0:
        raise ValueError(f"QLSD* is unstable at step_size={step_size:g}, kappa={kappa:g}: take a smaller step size")
    return float(2 * step_size * d / denom)


def loglog_slope(x, y, se=None) -> tuple[float, float]:
    """Slope of ``log y`` against ``log x`` by (weighted, if ``se`` of ``y`` is given) least squares,
    and its standard error (from the residuals when unweighted; from ``se`` when weighted)."""
    lx, ly = np.log(np.asarray(x, np.float64)), np.log(np.asarray(y, np.float64))
    if len(lx) < 3 - (se is not None):
        raise ValueError(f"need at least {3 - (se is not None)} points for a slope (got {len(lx)})")
    w = np.ones_like(lx) if se is None else (np.asarray(y, np.float64) / np.asarray(se, np.float64)) ** 2
    a = np.stack([np.ones_like(lx), lx], axis=1)
    cov = np.linalg.inv(a.T @ (w[:, None] * a))
    coef = cov @ a.T @ (w * ly)
    if se is None:
        resid = ly - a @ coef
        cov = cov * float(resid @ resid) / (len(lx) - 2)
    return float(coef[1]), float(np.sqrt(cov[1, 1]))


def closed_form(step_sizes, levels, kappas: dict, sizes: np.ndarray, d: int, norm_bias2) -> dict:
    """Per step size: the closed-form second moment, ``Delta`` and squared bias of ``E||theta||`` at every
    level s (``kappas[s]`` = ``kappa_bar`` and its s.e.), and the log-log slopes of ``Delta`` against omega."""
    n = float(sizes.sum())
    closed = {}
    for gamma in step_sizes:
        m0 = stationary_second_moment(gamma, sizes, 0.0, d)
        rows = []
        for s in levels:
            m = stationary_second_moment(gamma, sizes, kappas[s][0], d)
            rows.append({"levels": s, "omega": float(quantization_omega(s, d)), "kappa_bar": kappas[s][0],
                         "kappa_bar_se": kappas[s][1], "second_moment": m, "delta": m - m0,
                         "relative_delta": (m - m0) / (d / n), "norm_bias2": norm_bias2(m)})
        slope, slope_se = loglog_slope([r["omega"] for r in rows], [r["delta"] for r in rows])
        closed[f"{gamma:g}"] = {"step_size": gamma, "gamma_N": gamma * n, "lsd_second_moment": m0,
                                "lsd_norm_bias2": norm_bias2(m0), "rows": rows,
                                "slope_vs_omega": slope, "slope_vs_omega_se": slope_se}
        # omega = d / s^2 for s >= sqrt(d), sqrt(d) / s below: the slope in each regime
        for key, part in (("s_ge_sqrt_d", [r for r in rows if r["levels"] ** 2 >= d]),
                          ("s_le_sqrt_d", [r for r in rows if r["levels"] ** 2 <= d])):
            if len(part) >= 3:
                closed[f"{gamma:g}"][f"slope_vs_omega_{key}"] = dict(zip(("slope", "se"), loglog_slope(
                    [r["omega"] for r in part], [r["delta"] for r in part])))
    return closed


def slopes_vs_gamma(closed: dict, levels, step_sizes, n: float) -> dict:
    """Per level s: the log-log slope of the closed-form ``Delta`` against gamma, over every step size
    and over those with ``gamma N <= 0.1``."""
    gammas = [float(g) for g in step_sizes]
    small = [g for g in gammas if g * n <= 0.1]  # the gamma -> 0 regime of the paper's Table 1
    slope_gamma = {}
    for s in levels:
        delta = {g: next(r["delta"] for r in closed[f"{g:g}"]["rows"] if r["levels"] == s) for g in gammas}
        entry = {}
        if len(gammas) >= 3:
            entry["all"] = dict(zip(("slope", "se"), loglog_slope(gammas, [delta[g] for g in gammas])))
        if len(small) >= 2:
            entry["gamma_N_le_0.1"] = dict(zip(("slope", "se"), loglog_slope(small, [delta[g] for g in small],
                                                                            [1e-12 * delta[g] for g in small])))
        slope_gamma[str(s)] = entry
    return slope_gamma


def science(cfg: dict, run: Run) -> Findings:
    if not 0 <= cfg["burn_in"] < cfg["num_iterations"]:
        raise ValueError(f"burn_in ({cfg['burn_in']}) must lie in [0, num_iterations = {cfg['num_iterations']})")
    data, model, post = problems.heterogeneous_gaussian()
    sizes = np.asarray(data.counts, np.float64)
    d, n = model.dim, float(sizes.sum())
    truth = post.expected_norm()

    def norm_bias2(m):
        return (GaussianPosterior(post.mean, m / d).expected_norm() - truth) ** 2

    levels = sorted({int(s) for s in cfg["levels"]} | {int(s) for s in cfg["mc_levels"]})
    kappas = {s: kappa_bar(s, d, cfg["sphere_draws"], cfg["seed"]) for s in levels}
    closed = closed_form(cfg["step_sizes"], levels, kappas, sizes, d, norm_bias2)
    slope_gamma = slopes_vs_gamma(closed, levels, cfg["step_sizes"], n)

    # simulations: QLSD* and LSD* chains with shared seeds, E||theta - theta*||^2 per chain
    mode = exact_mode(data, post)
    batch = np.maximum(np.asarray(data.counts) // 10, 1)
    centre = np.asarray(post.mean, np.float32)

    def sq_dist(theta):
        import jax.numpy as jnp

        return jnp.sum((theta - centre) ** 2)

    chains = {}
    for gamma in cfg["mc_step_sizes"]:
        per = {}
        for s in [None] + [int(v) for v in cfg["mc_levels"]]:
            label = "LSD*" if s is None else f"QLSD* s={s}"
            sampler = (lsd_star(model, gamma, mode, batch, name=label) if s is None
                       else qlsd_star(model, gamma, mode, batch, quantization(s), name=label))
            res = run.simulate(cfg["seed"], sampler, data, centre, cfg["num_iterations"],
                               num_chains=cfg["num_chains"], burn_in=cfg["burn_in"], thinning=cfg["num_iterations"],
                               statistic=sq_dist, description=f"{label}, gamma={gamma:g}",
                               folder=f"gamma{gamma:g}-{'lsd' if s is None else f's{s}'}")
            per[s] = res.statistics.astype(np.float64).mean(axis=1)  # [chain]
        rows = []
        for s in cfg["mc_levels"]:
            diff = per[int(s)] - per[None]
            rows.append({"levels": int(s), "omega": float(quantization_omega(int(s), d)),
                         "delta": float(diff.mean()), "delta_se": float(diff.std(ddof=1) / np.sqrt(len(diff))),
                         "closed_form_delta": next(r["delta"] for r in closed[f"{gamma:g}"]["rows"]
                                                   if r["levels"] == int(s)) if f"{gamma:g}" in closed else None})
        entry = {"lsd_second_moment": float(per[None].mean()),
                 "lsd_second_moment_se": float(per[None].std(ddof=1) / np.sqrt(len(per[None]))),
                 "lsd_second_moment_exact": stationary_second_moment(gamma, sizes, 0.0, d), "rows": rows}
        ok = [r for r in rows if r["delta"] > 2 * r["delta_se"]]
        if len(ok) >= 2:
            entry["slope_vs_omega"], entry["slope_vs_omega_se"] = loglog_slope(
                [r["omega"] for r in ok], [r["delta"] for r in ok], [r["delta_se"] for r in ok])
            entry["slope_points"] = [r["levels"] for r in ok]
        chains[f"{gamma:g}"] = entry

    return Findings(
        settings={**cfg, "num_clients": data.num_clients, "dim": d, "total_points": int(n),
                  "sum_squared_sizes": float(np.sum(sizes**2)), "batch_sizes": batch.tolist()},
        results={"paper_claim": "asymptotic bias of QLSD* of order omega O(gamma): log-log slope 1 against omega "
                                "and gamma (2 for an MSE)",
                 "posterior": {"variance": post.var, "second_moment": d / n, "expected_norm": truth},
                 "closed_form": closed,
                 "slope_vs_gamma": slope_gamma,
                 "chains": chains},
        figures={"bias_vs_omega.png": partial(plot, closed=closed, chains=chains, posterior_m=d / n,
                                              quick=run.quick)})


def plot(path: Path, closed: dict, chains: dict, posterior_m: float, quick: bool):
    fig, axes = figures.new_figure(ncols=2, figsize=(11, 4.2))
    for i, (key, c) in enumerate(closed.items()):
        om = [r["omega"] for r in c["rows"]]
        axes[0].loglog(om, [r["norm_bias2"] for r in c["rows"]], "-o", ms=3, color=f"C{i}", label=f"gamma = {key}")
        axes[0].axhline(c["lsd_norm_bias2"], color=f"C{i}", linestyle=":", linewidth=1)
        axes[1].loglog(om, [r["relative_delta"] for r in c["rows"]], "-", color=f"C{i}",
                       label=f"gamma = {key}, slope {c['slope_vs_omega']:.2f}")
        if key in chains:
            rows = [r for r in chains[key]["rows"] if r["delta"] > 0]
            axes[1].errorbar([r["omega"] for r in rows], [r["delta"] / posterior_m for r in rows],
                             yerr=[r["delta_se"] / posterior_m for r in rows], fmt="o", color=f"C{i}", ms=4)
    axes[0].set_ylabel("bias^2 of E||theta|| (dotted: LSD*)")
    axes[1].set_ylabel("Delta / (d / N) (lines: recursion, dots: chains)")
    for ax in axes:
        ax.set_xlabel("omega = min(d / s^2, sqrt(d) / s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("QLSD* on the toy Gaussian: bias against omega" + (" (quick)" if quick else ""))
    figures.save_figure(fig, path)
