"""QLSD++ with and without memory terms on SYNTHETIC(1, 1) (Vono et al., AISTATS 2022,
supplement, Figure S3).

Data: SYNTHETIC(1, 1) of FedProx (:func:`fedmcmc.data.partition.synthetic`) with b = 50
clients, inputs in d = 2 and two classes (FedProx client sizes). Model: Bayesian logistic
regression without intercept, ``p(y = 1 | x, theta) = sigmoid(x . theta)``, theta in R^2,
prior N(0, prior_scale^2 I) with ``prior_scale^2 = 2e-2``: Figure S3 does not name its prior,
so we take the one of the paper's logistic-regression experiment (Section 4, "zero-mean
Gaussian prior with covariance 2 10^-2 I_d"). Samplers: QLSD++ with s in {2, 4} quantisation
levels, with memory (``alpha = 1 / (omega + 1)``) and without (``alpha = 0``), SVRG references
refreshed every l = 100 rounds, minibatches of ``batch_size`` points per client,
gamma = 1e-5, K = 100,000 rounds from 0 with no burn-in (as the paper); LSD++ (no compression)
as the floor. Metric (the paper's, "the Euclidean norm of the error between the true variance
under pi estimated with MALA and the empirical variance"): ``||v - v^ref||_2``, with ``v`` the
running per-coordinate variance of one chain's draws so far and ``v^ref`` that of a long MALA
run on the pooled posterior, averaged over chains (the paper shows one run; we run
``num_chains`` for a standard error). The relative error ``(1/d) sum_j |v_j - v_j^ref| / v_j^ref``
is reported too. Budget: 10 chains (the paper does not say how many runs Figure S3 averages).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.estimators import gradients
from fedmcmc.evaluation import reference
from fedmcmc.compression import quantization, quantization_omega
from fedmcmc.data import partition
from fedmcmc.data.federated import from_clients
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models import logistic_regression
from fedmcmc.samplers import lsd_pp, qlsd_pp

NAME = "qlsd-memory"
SUMMARY = "QLSD++ with and without memory on SYNTHETIC(1, 1), d = 2, b = 50: error in variance vs MALA (QLSD Fig. S3)"

FULL = dict(seed=0, data_seed=0, num_clients=50, dim=2, alpha=1.0, beta=1.0, prior_scale=float(np.sqrt(2e-2)),
            levels=[2, 4], step_size=1e-5, refresh_every=100, batch_size=1, num_iterations=100_000, burn_in=0,
            thinning=10, num_chains=10, reference_samples=20_000, reference_chains=4, reference_warmup=2_000,
            reference_thinning=2, mala_step_fraction=0.5, curve_points=40)
QUICK = dict(FULL, num_iterations=10_000, num_chains=8, reference_samples=4_000, reference_warmup=1_000,
             reference_thinning=2, curve_points=20)


def methods(levels) -> list[tuple[str, int | None, bool]]:
    """(label, quantisation levels s or None for LSD++, memory) for every run of the study."""
    out = []
    for s in levels:
        out += [(f"QLSD++ s={s}, memory", int(s), True), (f"QLSD++ s={s}, no memory", int(s), False)]
    return out + [("LSD++", None, False)]


def variance_error(variance, reference_variance) -> np.ndarray:
    """The paper's metric: ``||v - v^ref||_2`` over the last axis of ``variance`` ``[..., d]``."""
    v = np.asarray(variance, np.float64)
    ref = np.asarray(reference_variance, np.float64)
    if ref.shape != v.shape[-1:]:
        raise ValueError(f"reference variance has shape {ref.shape}, need ({v.shape[-1]},)")
    return np.linalg.norm(v - ref, axis=-1)


def relative_variance_error(variance, reference_variance) -> np.ndarray:
    """``(1/d) sum_j |v_j - v_j^ref| / v_j^ref`` over the last axis of ``variance`` ``[..., d]``."""
    v = np.asarray(variance, np.float64)
    ref = np.asarray(reference_variance, np.float64)
    if ref.shape != v.shape[-1:]:
        raise ValueError(f"reference variance has shape {ref.shape}, need ({v.shape[-1]},)")
    if np.any(ref <= 0):
        raise ValueError("the reference variances must be > 0")
    return np.mean(np.abs(v - ref) / ref, axis=-1)


def _se(x) -> float:
    """Standard error of the mean of ``x`` (nan for one value)."""
    x = np.asarray(x, np.float64)
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def running_variance(samples, points: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-chain running variance (ddof = 0) of ``samples[chain, draw, d]`` after the first
    ``n`` draws, at ``points`` values of ``n`` from 2 to the number of draws: ``(n, var[chain, n, d])``."""
    x = np.asarray(samples, np.float64)
    n = x.shape[1]
    if n < 2:
        raise ValueError(f"need at least 2 kept draws per chain (got {n})")
    ends = np.unique(np.geomspace(2, n, min(points, n - 1)).astype(int))
    s1 = np.cumsum(x, axis=1)[:, ends - 1]
    s2 = np.cumsum(x**2, axis=1)[:, ends - 1]
    mean = s1 / ends[None, :, None]
    return ends, np.maximum(s2 / ends[None, :, None] - mean**2, 0.0)


def problem(cfg: dict):
    """SYNTHETIC(alpha, beta) clients, the logistic model and the posterior mode and Hessian there."""
    clients = partition.synthetic(cfg["data_seed"], cfg["alpha"], cfg["beta"], num_clients=cfg["num_clients"],
                                  dim=cfg["dim"], num_classes=2)
    data = from_clients(clients)
    model = logistic_regression(cfg["dim"], cfg["prior_scale"])
    mode = gradients.find_mode(model, data)
    x = np.concatenate([c[0] for c in clients]).astype(np.float64)
    p = 1.0 / (1.0 + np.exp(-x @ np.asarray(mode.theta, np.float64)))
    hessian = (x * (p * (1 - p))[:, None]).T @ x + np.eye(cfg["dim"]) / cfg["prior_scale"] ** 2
    return clients, data, model, mode, hessian


def science(cfg: dict, run: Run) -> Findings:
    if not 0 <= cfg["burn_in"] < cfg["num_iterations"]:
        raise ValueError(f"burn_in ({cfg['burn_in']}) must lie in [0, num_iterations = {cfg['num_iterations']})")
    if (cfg["num_iterations"] - cfg["burn_in"]) % cfg["thinning"] or cfg["num_iterations"] % cfg["thinning"]:
        raise ValueError(f"num_iterations and burn_in must be multiples of thinning ({cfg['thinning']})")
    clients, data, model, mode, hessian = problem(cfg)
    d, b = model.dim, data.num_clients
    eig = np.linalg.eigvalsh(hessian)
    h = cfg["mala_step_fraction"] / eig[-1]
    ref = reference.mala(cfg["seed"], model, data, h, num_samples=cfg["reference_samples"],
                         num_chains=cfg["reference_chains"], num_warmup=cfg["reference_warmup"],
                         thinning=cfg["reference_thinning"], theta0=np.asarray(mode.theta), name="qlsd-memory")
    ref_var = ref.samples.reshape(-1, d).astype(np.float64).var(axis=0)
    laplace_var = np.diag(np.linalg.inv(hessian))

    results, table = {}, {}
    for label, s, memory in methods(cfg["levels"]):
        common = dict(batch_size=cfg["batch_size"], refresh_every=cfg["refresh_every"], name=label)
        if s is None:
            sampler = lsd_pp(model, cfg["step_size"], **common)
        else:
            sampler = qlsd_pp(model, cfg["step_size"], compressor=quantization(s), memory=memory, **common)
        tag = label.replace("QLSD++ ", "qlsdpp-").replace(", ", "-").replace("=", "").replace(" ", "-")
        res = run.simulate(cfg["seed"], sampler, data, np.zeros(d), cfg["num_iterations"],
                           num_chains=cfg["num_chains"], burn_in=cfg["burn_in"], thinning=cfg["thinning"],
                           description=label, folder=tag)
        results[label] = res
        ends, var = running_variance(res.samples, cfg["curve_points"])
        err = variance_error(var, ref_var)  # [chain, point]
        rel = relative_variance_error(var[:, -1], ref_var)
        final_var = var[:, -1]
        final = err[:, -1]
        table[label] = {
            "levels": s, "memory": memory,
            "memory_rate": (float(1.0 / (quantization_omega(s, d) + 1.0)) if memory else 0.0) if s else None,
            "omega": float(quantization_omega(s, d)) if s else 0.0,
            "variance_error": float(final.mean()),
            "variance_error_se": _se(final),
            "relative_variance_error": float(rel.mean()),
            "relative_variance_error_se": _se(rel),
            "variance_mean_over_chains": final_var.mean(axis=0).tolist(),
            "variance_ratio_to_reference": (final_var.mean(axis=0) / ref_var).tolist(),
            "bits_per_iteration": float(res.total_bits_up.mean() / cfg["num_iterations"]),
            "curve": {"iterations": (cfg["burn_in"] + ends * cfg["thinning"]).tolist(),
                      "kept_draws": ends.tolist(), "mean": err.mean(axis=0).tolist(),
                      "se": [_se(e) for e in err.T]},
            "sampler_seconds": res.wall_seconds,
        }

    sizes = [int(len(c[1])) for c in clients]
    return Findings(
        settings={**cfg, "num_clients": b, "dim": d, "total_points": int(sum(sizes)), "client_sizes": sizes,
                  "model": "logistic regression without intercept, prior N(0, prior_scale^2 I)",
                  "prior_variance": cfg["prior_scale"] ** 2,
                  "metric": "||v - v_ref||_2, v = per-chain variance of the kept draws, averaged over chains "
                            "(relative_variance_error: mean over j of |v_j - v_j^ref| / v_j^ref)"},
        results={"posterior": {"mode": np.asarray(mode.theta).tolist(), "hessian_eigenvalues": eig.tolist(),
                               "laplace_variance": laplace_var.tolist(),
                               "ula_relative_variance_bias": (cfg["step_size"] * eig / 2).tolist()},
                 "reference": {"kind": "MALA", "step_size": float(h), "variance": ref_var.tolist(),
                               "mean": ref.samples.reshape(-1, d).mean(axis=0).tolist(), "acceptance": ref.acceptance,
                               "rhat": ref.rhat, "ess": ref.ess,
                               "num_draws": int(ref.samples.shape[0] * ref.samples.shape[1]),
                               "variance_relative_se": float(np.sqrt(2.0 / ref.ess)), "cached": ref.cached},
                 "methods": table},
        posterior=results,
        figures={"variance_error.png": partial(plot, table=table, quick=run.quick)})


def plot(path: Path, table: dict, quick: bool):
    fig, ax = figures.new_figure(figsize=(6.5, 4.2))
    colours = {}
    for label, m in table.items():
        key = m["levels"]
        colours.setdefault(key, f"C{len(colours)}")
        style = "-" if m["memory"] else "--"
        if m["levels"] is None:
            style = ":"
        c = m["curve"]
        mean, se = np.asarray(c["mean"]), np.asarray(c["se"])
        ax.loglog(c["iterations"], mean, style, color=colours[key], label=label)
        if np.all(np.isfinite(se)):
            ax.fill_between(c["iterations"], np.maximum(mean - se, mean / 10), mean + se, color=colours[key],
                            alpha=0.15)
    ax.set_xlabel("iterations")
    ax.set_ylabel("||variance - MALA variance||")
    ax.set_title("QLSD++ memory, SYNTHETIC(1, 1), d = 2, b = 50" + (" (quick)" if quick else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    figures.save_figure(fig, path)
