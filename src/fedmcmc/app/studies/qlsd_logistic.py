"""QLSD++ against LSD++, DG-SGLD and FSGLD on Bayesian logistic regression with 784 pixels over
50 clients (Vono et al., AISTATS 2022, Section 4 "Bayesian logistic regression", Table 3).

**The paper's setting**: FEMNIST, d = 784, b = 50 clients, prior N(0, 2 10^-2 I_d), l = 100,
alpha = 1 / (omega + 1), gamma = 10^-5, s in {2^4, 2^8, 2^16}; K = 500,000 iterations with
50,000 of burn-in (supplement S5.2). FEMNIST is not offline, so we take the closest 784-pixel
binary task we can ship: two Fashion-MNIST classes (``classes``, T-shirt/top against shirt by
default), a random subset of ``num_train`` training images (the paper too used "a random
subset of the initial training data"), pixels in [0, 1] centred by the training mean (without
centring, the bound gamma lambda_max(X^T X) / 4 on gamma L passes 1 at about 2,700 images of
these classes and is 4.4 with all 12,000; centred, it is 0.2 at 5,000), no intercept (d = 784). The
images are dealt to b = 50 clients with per-class Dirichlet(``dirichlet_alpha``) proportions
(label skew; FEMNIST's clients are writers, a feature skew we cannot ship).
Model: ``p(y = 1 | x, theta) = sigmoid(x . theta)``, prior N(0, ``prior_variance`` I).

Samplers (all from the posterior mode, found by the federated mode search whose bits are reported and not
charged to any sampler, with the same number of chain iterations):

- LSD++ (Algorithm S3) and QLSD++ (Algorithm 2) with s = 2^p for p in ``bits``, memory rate
  ``1 / (omega + 1)``, SVRG anchor every l = 100 rounds, ``batch_size`` points per client,
  gamma = 1e-5;
- DG-SGLD with tolerance ``rho`` and client steps ``0.5 / (L_i + 1 / rho)``, ``dg_local_steps``
  local steps per round;
- FSGLD (CG-DSGLD) with diagonal Gaussian surrogates from the second-order expansion of each
  shard's log-density at the mode (``surrogates.taylor``), shards visited with probability
  N_s / N, step ``h = 2 gamma`` in FSGLD's convention, ``fsgld_local_steps`` steps per visit
  (an iteration is a local step). The paper does not give its baselines' settings
  (``baselines`` picks which of the two run).

Budget (two shared cores): 4 chains of 10,000 iterations with 2,000 of burn-in (the paper: 500,000
and 50,000), 5,000 training images, NUTS with 2 x 500 draws; ``--set num_iterations=500000 --set
burn_in=50000`` runs the paper's length.

Metrics:

- the relative 99% HPD error ``|eta - eta_ref| / eta_ref`` of
  :func:`fedmcmc.evaluation.hpd_relative_error` (``eta`` the 0.99-quantile of the potential
  U over the draws), against LSD++ as in the paper (``hpd_error_vs_lsd``; it measures the
  compression error only) and against NUTS on the pooled posterior (``hpd_error_vs_nuts``,
  ours: it adds the discretisation bias shared with LSD++). Standard errors from the spread of
  the per-chain thresholds. ``eta`` depends on the additive constant of U (here the Bernoulli
  log-likelihood without the prior's normalising constant), so relative HPD errors only compare
  within one study, not with the paper's values;
- the relative efficiency, bits per iteration of the uncompressed method over the method's:
  with the paper's formula, ``32 d / qsgd_bits_bound(s, d)`` (:func:`paper_efficiency`, the QSGD
  bound with natural logarithms, 7.6 / 6.7 / 3.1 at d = 784), and with our encoded bits
  (uploads of all clients, setup included), ``bits_LSD++ / bits``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.estimators import gradients, surrogates
from fedmcmc import evaluation
from fedmcmc.evaluation import reference
from fedmcmc.compression import qsgd_bits_bound, quantization
from fedmcmc.data import load_dataset, partition
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models import logistic_regression
from fedmcmc.samplers import cg_dsgld, dg_sgld, lsd_pp, qlsd_pp

NAME = "qlsd-logistic"
SUMMARY = ("QLSD++ 4/8/16 bits vs LSD++, DG-SGLD, FSGLD: logistic regression on 784 pixels over 50 clients, "
           "HPD error and relative efficiency (QLSD Table 3)")

#: Table 3 of the paper (FEMNIST): (99% HPD error against LSD++, relative efficiency).
PAPER = {"FSGLD": (5.4e-3, 6.2), "DG-SGLD": (5.2e-3, 6.4), "QLSD++ 4 bits": (6.1e-3, 7.6),
         "QLSD++ 8 bits": (4.3e-3, 6.7), "QLSD++ 16 bits": (6.9e-4, 3.1)}

FULL = dict(seed=0, dataset="fashion-mnist", classes=[0, 6], num_train=5000, num_clients=50, dirichlet_alpha=0.5,
            min_client_size=10,
            prior_variance=2e-2, step_size=1e-5, bits=[4, 8, 16], refresh_every=100, batch_size=10,
            num_iterations=10_000, burn_in=2_000, thinning=20, num_chains=4, rho=1e-3, dg_local_steps=1,
            fsgld_local_steps=10, baselines=["DG-SGLD", "FSGLD"], hpd_level=0.99, reference_samples=500,
            reference_warmup=300, reference_chains=2, test_size=2000)
QUICK = dict(FULL, num_iterations=3_000, burn_in=600, num_chains=2, reference_samples=200, reference_warmup=150)


def paper_efficiency(levels, d: int) -> float:
    """The paper's relative efficiency of a p-bit QLSD++: ``32 d / B(s, d)``, with ``B`` the QSGD bit
    bound (:func:`fedmcmc.compression.qsgd_bits_bound`, natural logarithms): 32-bit floats over the
    bound on the bits of one quantised message."""
    return 32.0 * d / qsgd_bits_bound(levels, d)


def problem(cfg: dict):
    """Two classes of the image set, a training subset, centred pixels, the 50 clients and the model.

    Returns ``(x_train, y_train, x_test, y_test, parts, data, model, local_lipschitz, source)``.
    """
    ds = load_dataset(cfg["dataset"], task="classification")
    classes = [int(c) for c in cfg["classes"]]
    if len(classes) != 2 or len(set(classes)) != 2 or not all(0 <= c < ds.num_classes for c in classes):
        raise ValueError(f"classes must be two distinct class indices of {cfg['dataset']} in "
                         f"[0, {ds.num_classes}) (got {cfg['classes']!r})")
    rng = np.random.default_rng(cfg["seed"])

    def pick(x, y, size):
        idx = np.flatnonzero(np.isin(y, classes))
        if size:
            if size > len(idx):
                raise ValueError(f"asked for {size} images of classes {classes}, the set has {len(idx)}")
            idx = np.sort(rng.choice(idx, size, replace=False))
        return (np.asarray(x[idx], np.float64).reshape(len(idx), -1),
                (np.asarray(y[idx]) == classes[1]).astype(np.int32))

    x_train, y_train = pick(ds.x, ds.y, int(cfg["num_train"]))
    if ds.test is not None:
        available = int(np.isin(ds.test[1], classes).sum())
        x_test, y_test = pick(ds.test[0], ds.test[1], min(int(cfg["test_size"]), available))
    else:
        x_test, y_test = x_train[:0], y_train[:0]
    centre = x_train.mean(axis=0)
    x_train, x_test = (x_train - centre).astype(np.float32), (x_test - centre).astype(np.float32)
    parts = partition.dirichlet(cfg["seed"], y_train, cfg["num_clients"], cfg["dirichlet_alpha"],
                                min_size=cfg["min_client_size"])
    data = partition.federate(x_train, y_train, parts)
    model = logistic_regression(x_train.shape[1], float(np.sqrt(cfg["prior_variance"])))
    x64 = x_train.astype(np.float64)
    local = np.array([np.linalg.eigvalsh(x64[p].T @ x64[p])[-1] / 4 for p in parts])
    source = f"{ds.source}; classes {classes} (y = 1 for {classes[1]}), {len(y_train)} training images"
    return x_train, y_train, x_test, y_test, parts, data, model, local, source


def _thresholds(model, samples, pooled, level):
    """``eta`` from all draws, its standard error from the per-chain thresholds, and those thresholds."""
    u = evaluation.neg_log_posterior(model, samples, pooled).reshape(np.shape(samples)[:2])  # [chain, draw]
    per_chain = np.array([evaluation.hpd_threshold(u[c], level) for c in range(u.shape[0])])
    return evaluation.hpd_threshold(u, level), _se(per_chain), per_chain, u


def _se(x) -> float:
    x = np.asarray(x, np.float64)
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def relative_hpd_error(eta, se, eta_ref, se_ref) -> tuple[float, float]:
    """``|eta - eta_ref| / |eta_ref|`` and its standard error (independent estimates, first order)."""
    return abs(eta - eta_ref) / abs(eta_ref), float(np.hypot(se, se_ref) / abs(eta_ref))


def check(cfg: dict) -> None:
    """One-line errors for settings that cannot run."""
    loc = int(cfg["fsgld_local_steps"])
    for key in ("num_iterations", "burn_in"):
        if cfg[key] % cfg["thinning"] or cfg[key] % loc:
            raise ValueError(f"{key} ({cfg[key]}) must be a multiple of thinning ({cfg['thinning']}) and of "
                             f"fsgld_local_steps ({loc})")
    if not 0 <= cfg["burn_in"] < cfg["num_iterations"]:
        raise ValueError(f"burn_in ({cfg['burn_in']}) must lie in [0, num_iterations = {cfg['num_iterations']})")
    if cfg["thinning"] % loc and loc % cfg["thinning"]:
        raise ValueError(f"fsgld_local_steps ({loc}) and thinning ({cfg['thinning']}) must divide one another")
    unknown = set(cfg["baselines"]) - {"DG-SGLD", "FSGLD"}
    if unknown:
        raise ValueError(f"unknown baselines {sorted(unknown)}; baselines is a subset of ['DG-SGLD', 'FSGLD']")


def against_lsd(table: dict, potentials: dict, cfg: dict) -> None:
    """Add to every method of ``table`` its relative efficiency and its HPD errors against LSD++."""
    lsd, u_lsd = table["LSD++"], potentials["LSD++"]
    half = cfg["num_chains"] // 2
    for label, m in table.items():
        m["relative_efficiency_encoded"] = lsd["bits_per_iteration"] / m["bits_per_iteration"]
        # the paper's metric: every chain of the method against every chain of LSD++. Chain c of
        # every sampler uses the same seed, so the Langevin noise is shared (common random numbers)
        # and the standard error is that of the per-chain differences.
        m["hpd_error_vs_lsd"] = abs(m["hpd_threshold"] - lsd["hpd_threshold"]) / abs(lsd["hpd_threshold"])
        m["hpd_error_vs_lsd_se"] = _se(np.subtract(m["hpd_threshold_per_chain"], lsd["hpd_threshold_per_chain"])
                                       / abs(lsd["hpd_threshold"]))
        # as with independent runs: the method's first half of the chains against LSD++'s second half
        m["hpd_error_vs_lsd_unpaired"] = (evaluation.hpd_relative_error(
            potentials[label][:half], u_lsd[half:], cfg["hpd_level"]) if half else float("nan"))
        if label in PAPER:
            m["paper_hpd_error_vs_lsd"], m["paper_relative_efficiency"] = PAPER[label]


def science(cfg: dict, run: Run) -> Findings:
    check(cfg)
    loc = int(cfg["fsgld_local_steps"])
    x_train, y_train, x_test, y_test, parts, data, model, local, source = problem(cfg)
    d, b = model.dim, data.num_clients
    gamma = float(cfg["step_size"])
    pooled = (x_train, y_train)
    mode = gradients.find_mode(model, data)
    theta0 = np.asarray(mode.theta)
    x64 = x_train.astype(np.float64)
    lipschitz = float(np.linalg.eigvalsh(x64.T @ x64)[-1] / 4 + 1 / cfg["prior_variance"])
    ref = reference.nuts(cfg["seed"], model, data, num_samples=cfg["reference_samples"],
                         num_chains=cfg["reference_chains"], num_warmup=cfg["reference_warmup"], theta0=theta0,
                         name="qlsd-logistic")
    eta_nuts, se_nuts, _, _ = _thresholds(model, ref.samples, pooled, cfg["hpd_level"])
    rho = float(cfg["rho"])
    runs = [("LSD++", lambda: lsd_pp(model, gamma, cfg["batch_size"], refresh_every=cfg["refresh_every"]), 1, None)]
    for p in cfg["bits"]:
        runs.append((f"QLSD++ {p} bits",
                     lambda p=p: qlsd_pp(model, gamma, cfg["batch_size"], quantization(2 ** int(p)),
                                         refresh_every=cfg["refresh_every"]), 1, 2 ** int(p)))
    runs.append(("DG-SGLD", lambda: dg_sgld(model, rho, 0.5 / (local + 1 / rho), cfg["dg_local_steps"],
                                            cfg["batch_size"], num_clients=b), 1, None))
    runs.append(("FSGLD", lambda: cg_dsgld(model, np.asarray(data.weights), 2 * gamma, loc,
                                           surrogate=surrogates.taylor("diag"), batch_size=cfg["batch_size"]), loc,
                 None))
    runs = [r for r in runs if r[0] not in ("DG-SGLD", "FSGLD") or r[0] in cfg["baselines"]]

    results, table, potentials = {}, {}, {}
    for label, make, per_round, levels in runs:
        rounds, burn = cfg["num_iterations"] // per_round, cfg["burn_in"] // per_round
        thin = max(1, cfg["thinning"] // per_round)
        res = run.simulate(cfg["seed"], make(), data, theta0, rounds, num_chains=cfg["num_chains"], burn_in=burn,
                           thinning=thin, description=label, folder=label.replace(" ", "_").replace("+", "p"))
        results[label] = res
        eta, se, per_chain, potentials[label] = _thresholds(model, res.samples, pooled, cfg["hpd_level"])
        probs = evaluation.predict_bma(model, res.samples, x_test) if len(y_test) else None
        err_nuts, err_nuts_se = relative_hpd_error(eta, se, eta_nuts, se_nuts)
        table[label] = {
            "levels": levels,
            "hpd_threshold": eta, "hpd_threshold_se": se, "hpd_threshold_per_chain": per_chain.tolist(),
            "hpd_error_vs_nuts": err_nuts, "hpd_error_vs_nuts_se": err_nuts_se,
            "bits_per_iteration": float(res.total_bits_up.mean() / cfg["num_iterations"]),
            "setup_bits": float(res.setup_bits_up.mean()),
            "relative_efficiency_paper_formula": paper_efficiency(levels, d) if levels else None,
            "test_accuracy": evaluation.accuracy(probs, y_test) if probs is not None else None,
            "posterior_mean_error_vs_nuts": float(np.linalg.norm(res.samples.reshape(-1, d).mean(0)
                                                                 - ref.samples.reshape(-1, d).mean(0))),
            "num_draws": int(res.samples.shape[0] * res.samples.shape[1]),
            "rounds": rounds,
            "sampler_seconds": res.wall_seconds,
        }
    against_lsd(table, potentials, cfg)
    # the Monte-Carlo floor of the metric: NUTS's first half against its second half
    mid = ref.samples.shape[1] // 2
    floor = evaluation.hpd_relative_error(evaluation.neg_log_posterior(model, ref.samples[:, :mid], pooled),
                                          evaluation.neg_log_posterior(model, ref.samples[:, mid:], pooled),
                                          cfg["hpd_level"])
    ref_probs = evaluation.predict_bma(model, ref.samples, x_test) if len(y_test) else None
    return Findings(
        settings={**cfg, "num_clients": b, "dim": d, "num_train": int(len(y_train)),
                  "num_test": int(len(y_test)), "client_sizes": [int(len(p)) for p in parts],
                  "client_label_skew": partition.label_skew(partition.label_counts(y_train, parts)),
                  "gamma_times_lambda_max_bound": gamma * lipschitz,
                  "dg_sgld_client_steps": (0.5 / (local + 1 / rho)).tolist(), "fsgld_step_h": 2 * gamma,
                  "dataset_source": source},
        results={
            "mode": {"rounds": mode.rounds, "bits": mode.bits, "gradient_norm": mode.gradient_norm},
            "reference": {"kind": "NUTS", "hpd_threshold": eta_nuts, "hpd_threshold_se": se_nuts, "rhat": ref.rhat,
                          "ess": ref.ess, "divergences": ref.divergences,
                          "num_draws": int(ref.samples.shape[0] * ref.samples.shape[1]),
                          "hpd_error_between_halves": floor,
                          "test_accuracy": evaluation.accuracy(ref_probs, y_test) if ref_probs is not None else None,
                          "cached": ref.cached},
            "paper": {label: {"hpd_error_vs_lsd": e, "relative_efficiency": r} for label, (e, r) in PAPER.items()},
            "methods": table,
        },
        posterior=results,
        figures={"hpd_error_vs_efficiency.png": partial(plot, table=table, quick=run.quick)})


def plot(path: Path, table: dict, quick: bool):
    fig, axes = figures.new_figure(ncols=2, figsize=(11, 4.2))
    for i, (label, m) in enumerate(table.items()):
        if label == "LSD++":
            continue
        ours = axes[0].errorbar(m["relative_efficiency_encoded"], max(m["hpd_error_vs_lsd"], 1e-7),
                                yerr=m["hpd_error_vs_lsd_se"], fmt="o", color=f"C{i}", label=label)
        axes[1].errorbar(m["relative_efficiency_encoded"], max(m["hpd_error_vs_nuts"], 1e-7),
                         yerr=m["hpd_error_vs_nuts_se"], fmt="o", color=f"C{i}", label=label)
        if label in PAPER:
            axes[0].scatter(PAPER[label][1], PAPER[label][0], marker="x", color=ours.lines[0].get_color(),
                            label=f"{label} (paper, FEMNIST)")
    axes[1].errorbar(1.0, max(table["LSD++"]["hpd_error_vs_nuts"], 1e-7), yerr=table["LSD++"]["hpd_error_vs_nuts_se"],
                     fmt="s", color="k", label="LSD++")
    for ax, ref in zip(axes, ("LSD++ (paper's metric)", "NUTS")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("relative efficiency (bits of LSD++ / bits)")
        ax.set_ylabel(f"99% HPD error vs {ref}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Logistic regression, 784 pixels over 50 clients" + (" (quick)" if quick else ""))
    figures.save_figure(fig, path)
