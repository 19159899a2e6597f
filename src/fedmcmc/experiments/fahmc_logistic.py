"""FA-HMC on Fashion-MNIST: predictive metrics against communication rounds for the number of
leapfrog steps K and of local iterations T (Liang, Zhang, Deng, Lin, Song 2024, Section 5.3).

Bayesian multinomial logistic regression (784 pixels + intercept, 10 classes, d = 7,850,
prior N(0, I)) on the 60,000 Fashion-MNIST training images, dealt IID to 10 clients (6,000
each); every client uses minibatches of 1,000. Two sweeps, as in the paper: K in {1, 10, 50,
100} at T = 50, and T in {1, 10, 20, 50, 100} at K = 10. After every round we score, on the
10,000 test images, the Bayesian model average (BMA) of the draws of the last half of the
rounds so far (rounds floor(r/2)+1 .. r, pooled over chains): accuracy, Brier score, ECE
(15 bins) and NLL, plus the accuracy and NLL of the round's draw alone.

**Budget.** One round of K = 100, T = 50 is 5,001 minibatch gradients per client; two
CPU cores cannot give every setting the same number of rounds. Every setting gets the same
budget of gradient evaluations per client (``gradient_budget``), capped at ``rounds`` rounds
and never less than one round: it runs ``min(rounds, max(1, budget // (K T + 1)))`` rounds
(a round costs ``K T`` leapfrog gradients plus one at the broadcast position). We report
rounds and gradient evaluations needed to reach given test accuracies. ``--quick`` uses a
subset of 10,000 training and 2,000 test images projected on 50 principal axes, minibatches
of 100 and a larger step (the posterior of the reduced problem is less curved): a smoke test
of the pipeline, not a reproduction.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from fedmcmc import io, metrics, predictive
from fedmcmc.data import partition
from fedmcmc.data.datasets import load_classification, pca_project, split_and_standardise
from fedmcmc.experiments.settings import resolve
from fedmcmc.models.softmax import multinomial_logistic_regression
from fedmcmc.samplers import fa_hmc
from fedmcmc.simulator import simulate

#: The clock of the published results (docs/reproductions.md, "FA-HMC schedules"): T counts trajectories.
CLOCK = "trajectory"
NAME = "fahmc-logistic"
SUMMARY = ("FA-HMC, softmax regression on Fashion-MNIST: accuracy, Brier, ECE, NLL of the BMA against "
           "rounds for K and T (FA-HMC Sec. 5.3)")

FULL = dict(seed=0, dataset="fashion-mnist", num_clients=10, partition="iid", dirichlet_alpha=0.5,
            batch_size=1000, prior_scale=1.0, step_size=5e-4, correlation=1.0,
            leapfrog_sweep=[1, 10, 50, 100], sweep_local_steps=50,
            local_steps_sweep=[1, 10, 20, 50, 100], sweep_leapfrog=10,
            rounds=100, gradient_budget=2500, num_chains=1,
            train_subset=0, test_subset=0, pca_components=0,
            accuracy_targets=[0.75, 0.8, 0.82], ece_bins=15)
QUICK = dict(FULL, train_subset=10000, test_subset=2000, pca_components=50, batch_size=100, step_size=2e-3,
             rounds=30, gradient_budget=5000)

METRICS = ("accuracy", "brier", "ece", "nll")


def load_problem(cfg: dict):
    """Train/test split (optionally subset and PCA-reduced), the federated training data and the model.

    Raises the loader's FileNotFoundError (which says how to install the files) when
    Fashion-MNIST is missing.
    """
    split = split_and_standardise(load_classification(cfg["dataset"]), cfg["seed"])
    if cfg["train_subset"]:
        split = split._replace(x_train=split.x_train[:cfg["train_subset"]], y_train=split.y_train[:cfg["train_subset"]])
    if cfg["test_subset"]:
        split = split._replace(x_test=split.x_test[:cfg["test_subset"]], y_test=split.y_test[:cfg["test_subset"]])
    if cfg["pca_components"]:
        split = pca_project(split, cfg["pca_components"])
    x_train = split.x_train.reshape(split.x_train.shape[0], -1)
    x_test = split.x_test.reshape(split.x_test.shape[0], -1)
    n = len(split.y_train)
    if cfg["partition"] == "iid":
        parts = partition.iid(cfg["seed"], n, cfg["num_clients"])
    elif cfg["partition"] == "dirichlet":
        parts = partition.dirichlet(cfg["seed"], split.y_train, cfg["num_clients"], cfg["dirichlet_alpha"])
    else:
        raise ValueError(f"partition must be 'iid' or 'dirichlet' (got {cfg['partition']!r}); "
                         "e.g. --set partition=dirichlet --set dirichlet_alpha=0.5")
    data = partition.federate(x_train, split.y_train, parts)
    model = multinomial_logistic_regression(x_train.shape[1], split.num_classes, cfg["prior_scale"])
    info = {**{k: v for k, v in split.summary().items() if k not in ("shift", "scale")},
            "num_features": int(x_train.shape[1]), "dim": int(model.dim),
            "client_sizes": np.asarray(data.counts).tolist(),
            "client_label_skew": partition.label_skew(partition.label_counts(split.y_train, parts,
                                                                              split.num_classes))}
    return data, model, (x_test, split.y_test), info


def grid(cfg: dict) -> dict[str, tuple[int, int]]:
    """The (K, T) settings of both sweeps, each once, keyed ``"K=..,T=.."``."""
    pairs = [(int(k), int(cfg["sweep_local_steps"])) for k in cfg["leapfrog_sweep"]]
    pairs += [(int(cfg["sweep_leapfrog"]), int(t)) for t in cfg["local_steps_sweep"]]
    return {label(k, t): (k, t) for k, t in dict.fromkeys(pairs)}


def label(k: int, t: int) -> str:
    return f"K={k},T={t}"


def rounds_for(cfg: dict, k: int, t: int) -> int:
    """Rounds a setting runs: the gradient budget per client, at most ``rounds``, at least one."""
    return int(min(cfg["rounds"], max(1, cfg["gradient_budget"] // (k * t + 1))))


def bma_curves(probs: np.ndarray, y: np.ndarray, ece_bins: int) -> dict:
    """Metrics against rounds from per-draw test probabilities ``[chain, round, n, classes]``.

    At round ``r`` the predictive is the BMA of the draws of rounds ``floor(r/2)+1 .. r`` of
    every chain; ``draw_*`` score the round's draw alone (averaged over chains).
    """
    num_rounds = probs.shape[1]
    cum = np.concatenate([np.zeros((1,) + probs.shape[2:]), np.cumsum(probs.sum(axis=0, dtype=np.float64), axis=0)])
    out = {m: [] for m in METRICS + ("draw_accuracy", "draw_nll")}
    for r in range(1, num_rounds + 1):
        start = r // 2
        bma = (cum[r] - cum[start]) / ((r - start) * probs.shape[0])
        out["accuracy"].append(predictive.accuracy(bma, y))
        out["brier"].append(predictive.brier(bma, y))
        out["ece"].append(predictive.ece(bma, y, ece_bins))
        out["nll"].append(predictive.nll(bma, y))
        draws = probs[:, r - 1]
        out["draw_accuracy"].append(float(np.mean([predictive.accuracy(p, y) for p in draws])))
        out["draw_nll"].append(float(np.mean([predictive.nll(p, y) for p in draws])))
    return out


def run_setting(cfg: dict, data, model, test, k: int, t: int, out: Path, progress: bool, resume: bool) -> dict:
    """Run FA-HMC with K leapfrog steps and T local iterations; score the BMA after each round."""
    x_test, y_test = test
    num_rounds = rounds_for(cfg, k, t)
    name = label(k, t)
    sampler = fa_hmc(model, data.weights, cfg["step_size"], k, t, correlation=cfg["correlation"],
                     batch_size=cfg["batch_size"], name=name, clock=CLOCK)
    run_dir = out / "runs" / f"K{k}_T{t}"
    res = simulate(cfg["seed"], sampler, data, np.zeros(model.dim), num_rounds, num_chains=cfg["num_chains"],
                   progress=progress, description=name, resume=resume, out_dir=run_dir)
    io.write_posterior(run_dir / "posterior.nc", {name: res}, attrs={"experiment": NAME, "quick": cfg["quick"]})
    probs = predictive.predict_draws(model, res.samples, x_test).reshape(res.samples.shape[:2] + (len(y_test), -1))
    curves = bma_curves(probs, y_test, cfg["ece_bins"])
    per_round = k * t + 1
    rounds = np.arange(1, num_rounds + 1)
    error = 1.0 - np.asarray(curves["accuracy"])
    reach = {str(a): metrics.rounds_to_reach(error, 1.0 - a) for a in cfg["accuracy_targets"]}
    return {
        "num_leapfrog": k, "local_steps": t, "rounds_run": num_rounds,
        "gradients_per_client_per_round": per_round,
        "rounds": rounds.tolist(), "gradients_per_client": (rounds * per_round).tolist(),
        "curves": curves,
        "final": {m: curves[m][-1] for m in curves},
        "rounds_to_accuracy": reach,
        "gradients_to_accuracy": {a: r * per_round for a, r in reach.items()},
        "sampler_seconds": res.wall_seconds,
    }


def run(out: Path, quick: bool = False, seed: int | None = None, progress: bool = True,
        resume: bool = False, settings: dict | None = None) -> dict:
    cfg = resolve(FULL, QUICK, quick, seed, settings)
    out = Path(out)
    started = time.perf_counter()
    data, model, test, info = load_problem(cfg)
    results = {}
    for name, (k, t) in grid(cfg).items():
        results[name] = run_setting({**cfg, "quick": quick}, data, model, test, k, t, out, progress, resume)
    groups = {"leapfrog": [label(int(k), int(cfg["sweep_local_steps"])) for k in cfg["leapfrog_sweep"]],
              "local_steps": [label(int(cfg["sweep_leapfrog"]), int(t)) for t in cfg["local_steps_sweep"]]}
    payload = {
        "experiment": NAME,
        "quick": quick,
        "settings": cfg,
        "data": info,
        "bma": "rounds floor(r/2)+1 .. r of every chain",
        "groups": groups,
        "runs": results,
        "wall_seconds": time.perf_counter() - started,
    }
    io.write_json(out / "results.json", payload)
    title = "" if not quick else " (quick: subset, PCA)"
    plot_group(out / "metrics_vs_rounds_leapfrog.png", results, groups["leapfrog"],
               f"T = {cfg['sweep_local_steps']}, K varies{title}")
    plot_group(out / "metrics_vs_rounds_local_steps.png", results, groups["local_steps"],
               f"K = {cfg['sweep_leapfrog']}, T varies{title}")
    plot_cost(out / "accuracy_vs_gradients.png", results, groups, title)
    return payload


_YLABELS = {"accuracy": "test accuracy (BMA)", "brier": "Brier score", "ece": "ECE", "nll": "NLL"}


def plot_group(path: Path, results: dict, names: list[str], title: str):
    """Four panels (accuracy, Brier, ECE, NLL) against rounds, one line per setting."""
    fig, axes = io.new_figure(ncols=4, figsize=(16, 3.8))
    for ax, m in zip(axes, METRICS):
        for name in names:
            r = results[name]
            ax.plot(r["rounds"], r["curves"][m], "o-" if r["rounds_run"] <= 3 else "-", markersize=4, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("communication rounds")
        ax.set_ylabel(_YLABELS[m])
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"FA-HMC, Fashion-MNIST softmax regression: {title}")
    fig.tight_layout()
    io.save_figure(fig, path)


def plot_cost(path: Path, results: dict, groups: dict, title: str):
    """Test accuracy of the BMA against minibatch gradient evaluations per client, both sweeps."""
    fig, axes = io.new_figure(ncols=2, figsize=(10, 3.8))
    for ax, (group, names) in zip(axes, groups.items()):
        for name in names:
            r = results[name]
            ax.plot(r["gradients_per_client"], r["curves"]["accuracy"], "o-" if r["rounds_run"] <= 3 else "-",
                    markersize=4, label=name)
        ax.set_xscale("log")
        ax.set_xlabel("gradient evaluations per client")
        ax.set_ylabel("test accuracy (BMA)")
        ax.set_title(("K varies" if group == "leapfrog" else "T varies") + title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    io.save_figure(fig, path)
