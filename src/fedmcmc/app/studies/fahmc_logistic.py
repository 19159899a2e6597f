"""FA-HMC on Fashion-MNIST: predictive metrics against communication rounds for the number of
leapfrog steps K and of local steps T (Liang, Zhang, Deng, Lin, Song 2024, Section 5.3, Figures
3 and 4, supplement L).

Bayesian multinomial logistic regression (inputs + intercept, 10 classes, prior N(0, I)) on the
60,000 Fashion-MNIST training images, dealt IID to 10 clients (6,000 each); every client uses
minibatches of 1,000 (stochastic gradients, two draws per leapfrog step, Algorithm 1). FA-HMC on
the paper's leapfrog clock: positions averaged every T leapfrog steps, momenta redrawn every K
leapfrog steps from the shared seed (rho = 1, the same momentum initialisation across devices,
Section 5), each client keeping its momentum across a synchronisation inside a trajectory
(``momentum_sync``). Two sweeps, as in the paper: K in {1, 10, 50, 100} at T = 50 (a round is
50 leapfrog steps for every K: equal computation and communication per round), and T in {1, 10,
20, 50, 100} at K = 10.

**Metrics (Section 5.3).** One draw per round (the averaged theta the server holds); after round
r the predictive is the Bayesian model average of the draws of rounds 1 .. r of one run ("the
predicted probabilities made by all the previously collected parameter samples are averaged";
``bma_burn_in`` > 0 drops a leading fraction instead), scored on the 10,000 test images:
accuracy, Brier score (summed over classes), ECE (15 bins), NLL. Each setting runs
``num_runs`` independent chains (the paper: 5) and we report the mean and standard deviation
over runs, as supplement L does.

**Step size.** "We tune the step size eta in each setting for the best test statistic": for
each (K, T) we run a one-chain pilot (seed + 1, ``pilot_rounds`` rounds) at every eta of
``step_sizes`` and keep the eta with the lowest test NLL of the pilot's BMA at its last round
(NLL scores accuracy and calibration at once; the paper does not say which statistic, and
tunes on the test set, as we do).

**Cost.** A minibatch leapfrog step draws two gradients (fresh randomness for each half-kick), so
a round costs 2 T minibatch gradients per client; ``gradients_per_client`` counts them.
The full setting uses the top ``pca_components`` = 50 principal axes of the pixels (d = 510,
test accuracy about 0.82 against about 0.84 for all 784 pixels) and ``rounds`` = 40: one T = 50
round of five runs on all pixels (d = 7,850) took 21 CPU-seconds here, so the paper's setting
(8 settings x 5 runs x tuning) would not fit the 15-core-minute budget at any useful number of
rounds. ``--set pca_components=0`` uses every pixel, ``--set rounds=...`` runs longer.
``--quick`` uses a subset of 10,000 training and 2,000 test images on 20 principal axes,
minibatches of 100, two runs and ten rounds: a smoke test of the pipeline, not a reproduction.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc import evaluation
from fedmcmc.evaluation import distances as metrics
from fedmcmc.data import load_dataset, partition, pca_project, split_and_standardise
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models.softmax import multinomial_logistic_regression
from fedmcmc.samplers import fa_hmc

NAME = "fahmc-logistic"
SUMMARY = ("FA-HMC, softmax regression on Fashion-MNIST: accuracy, Brier, ECE, NLL of the BMA against "
           "rounds for K and T, leapfrog clock (FA-HMC Sec. 5.3, Figs. 3-4)")

FULL = dict(seed=0, dataset="fashion-mnist", num_clients=10, partition="iid", dirichlet_alpha=0.5,
            batch_size=1000, prior_scale=1.0, correlation=1.0, momentum_sync="local",
            leapfrog_sweep=[1, 10, 50, 100], sweep_local_steps=50,
            local_steps_sweep=[1, 10, 20, 50, 100], sweep_leapfrog=10,
            rounds=40, num_runs=5, step_sizes=[3e-4, 6e-4, 1.2e-3], pilot_rounds=10, bma_burn_in=0.0,
            train_subset=0, test_subset=0, pca_components=50,
            accuracy_targets=[0.75, 0.8, 0.82], ece_bins=15)
QUICK = dict(FULL, train_subset=10000, test_subset=2000, pca_components=20, batch_size=100,
             step_sizes=[1e-3, 2e-3], rounds=10, pilot_rounds=4, num_runs=2, accuracy_targets=[0.75, 0.8])

METRICS = ("accuracy", "brier", "ece", "nll")
def load_problem(cfg: dict, make_model=None):
    """Train/test split (optionally subset and PCA-reduced), the federated training data and the model
    (``make_model(num_features, num_classes)``; softmax regression with ``prior_scale`` if None).

    Raises the loader's FileNotFoundError (which says how to install the files) when
    Fashion-MNIST is missing.
    """
    split = split_and_standardise(load_dataset(cfg["dataset"], task="classification"), cfg["seed"])
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
    if make_model is None:
        model = multinomial_logistic_regression(x_train.shape[1], split.num_classes, cfg["prior_scale"])
    else:
        model = make_model(x_train.shape[1], split.num_classes)
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


def gradients_per_round(t: int) -> int:
    """Minibatch gradients a client draws in a round of ``t`` leapfrog steps: two per step
    (Algorithm 1's fresh draw for each half-kick, :func:`fedmcmc.samplers.integrators.leapfrog_step`)."""
    return 2 * int(t)


def bma_curves(probs: np.ndarray, y: np.ndarray, ece_bins: int, burn_in: float = 0.0) -> dict:
    """Per-run metrics against rounds from per-draw test probabilities ``[run, round, n, classes]``.

    At round ``r`` a run's predictive is the BMA of its draws of rounds ``floor(burn_in r)+1 .. r``
    (all draws so far when ``burn_in`` = 0, the paper's rule). Returns ``{metric: [run, round]}``.
    """
    if not 0.0 <= burn_in < 1.0:
        raise ValueError(f"bma_burn_in must be a fraction in [0, 1) (got {burn_in!r})")
    num_runs, num_rounds = probs.shape[:2]
    out = {m: np.zeros((num_runs, num_rounds)) for m in METRICS}
    for c in range(num_runs):
        cum = np.concatenate([np.zeros((1,) + probs.shape[2:]), np.cumsum(probs[c], axis=0, dtype=np.float64)])
        for r in range(1, num_rounds + 1):
            start = int(np.floor(burn_in * r))
            bma = (cum[r] - cum[start]) / (r - start)
            out["accuracy"][c, r - 1] = evaluation.accuracy(bma, y)
            out["brier"][c, r - 1] = evaluation.brier(bma, y)
            out["ece"][c, r - 1] = evaluation.ece(bma, y, ece_bins)
            out["nll"][c, r - 1] = evaluation.nll(bma, y)
    return out


def sample(cfg: dict, data, model, test, k: int, t: int, step_size: float, num_rounds: int, num_runs: int,
           seed: int, run: Run, folder: str | None, theta0=None):
    """``num_runs`` independent FA-HMC chains from ``theta0`` (0 if None), run by ``run`` in
    ``runs/folder``; their BMA curves and the simulation result."""
    x_test, y_test = test
    sampler = fa_hmc(model, data.weights, step_size, k, t, correlation=cfg["correlation"],
                     batch_size=cfg["batch_size"], momentum_sync=cfg["momentum_sync"], name=label(k, t))
    theta0 = np.zeros(model.dim) if theta0 is None else theta0
    res = run.simulate(seed, sampler, data, theta0, num_rounds, num_chains=num_runs,
                       description=f"{label(k, t)} eta={step_size:g}", folder=folder)
    probs = evaluation.predict_draws(model, res.samples, x_test).reshape(res.samples.shape[:2] + (len(y_test), -1))
    return bma_curves(probs, y_test, cfg["ece_bins"], cfg["bma_burn_in"]), res


def tune(cfg: dict, data, model, test, k: int, t: int, run: Run, theta0=None) -> tuple[float, dict]:
    """The eta of ``step_sizes`` with the lowest test NLL of a one-chain pilot's BMA at its last round
    (no pilot when there is one eta; pilots run in memory, without a progress bar)."""
    if len(cfg["step_sizes"]) == 1:
        return float(cfg["step_sizes"][0]), {}
    pilot, quiet = {}, run._replace(progress=False, resume=False)
    for eta in cfg["step_sizes"]:
        curves, _ = sample(cfg, data, model, test, k, t, float(eta), cfg["pilot_rounds"], 1, cfg["seed"] + 1,
                           quiet, None, theta0)
        nll = float(curves["nll"][0, -1])
        pilot[f"{float(eta):g}"] = nll if np.isfinite(nll) else float("inf")
    best = min(cfg["step_sizes"], key=lambda e: pilot[f"{float(e):g}"])
    return float(best), pilot


def run_setting(cfg: dict, data, model, test, k: int, t: int, run: Run, theta0=None) -> dict:
    """Tune eta, run ``num_runs`` chains of FA-HMC(K, T) from ``theta0``, score the BMA after each round."""
    eta, pilot = tune(cfg, data, model, test, k, t, run, theta0)
    folder = f"K{k}_T{t}"
    curves, res = sample(cfg, data, model, test, k, t, eta, cfg["rounds"], cfg["num_runs"], cfg["seed"], run, folder,
                         theta0)
    run.write_posterior(f"runs/{folder}/posterior.nc", {label(k, t): res})
    per_round = gradients_per_round(t)
    rounds = np.arange(1, cfg["rounds"] + 1)
    mean = {m: curves[m].mean(axis=0) for m in METRICS}
    sd = {m: curves[m].std(axis=0, ddof=1) if cfg["num_runs"] > 1 else np.zeros(cfg["rounds"]) for m in METRICS}
    reach = {str(a): metrics.rounds_to_reach(1.0 - mean["accuracy"], 1.0 - a) for a in cfg["accuracy_targets"]}
    return {
        "num_leapfrog": k, "local_steps": t, "step_size": eta, "pilot_nll": pilot,
        "gradients_per_client_per_round": per_round,
        "rounds": rounds.tolist(), "gradients_per_client": (rounds * per_round).tolist(),
        "mean": {m: v.tolist() for m, v in mean.items()},
        "sd": {m: v.tolist() for m, v in sd.items()},
        "per_run": {m: v.tolist() for m, v in curves.items()},
        "final": {m: {"mean": float(mean[m][-1]), "sd": float(sd[m][-1])} for m in METRICS},
        "rounds_to_accuracy": reach,
        "sampler_seconds": res.wall_seconds,
    }


def compare(results: dict, names: list[str], baseline: str | None) -> dict:
    """Per metric: the best setting at the last round (mean over runs), and each setting's relative
    improvement over ``baseline`` at the last round and at its best round."""
    out = {}
    for m in METRICS:
        sign = 1.0 if m == "accuracy" else -1.0  # larger is better for accuracy only
        final = {n: results[n]["final"][m]["mean"] for n in names}
        entry = {"best_final": max(names, key=lambda n: sign * final[n]),
                 "ranking_final": sorted(names, key=lambda n: -sign * final[n])}
        if baseline in results:
            b = np.asarray(results[baseline]["mean"][m])
            gain = {n: sign * (np.asarray(results[n]["mean"][m]) - b) / np.abs(b) for n in names if n != baseline}
            entry["improvement_over_baseline_final"] = {n: float(g[-1]) for n, g in gain.items()}
            entry["improvement_over_baseline_max"] = {n: float(np.max(g)) for n, g in gain.items()}
        out[m] = entry
    return out


def science(cfg: dict, run: Run) -> Findings:
    return study(cfg, run, "softmax regression")


def study(cfg: dict, run: Run, title: str, make_model=None, initial=None) -> Findings:
    """Both sweeps of (K, T) on Fashion-MNIST; shared with ``fahmc-mlp``.

    ``make_model`` as in :func:`load_problem`; ``initial(num_features, num_classes)`` gives the
    chains' start (0 if None).
    """
    data, model, test, info = load_problem(cfg, make_model)
    theta0 = None if initial is None else initial(info["num_features"], info["num_classes"])
    results = {}
    for key, (k, t) in grid(cfg).items():
        results[key] = run_setting(cfg, data, model, test, k, t, run, theta0)
    groups = {"leapfrog": [label(int(k), int(cfg["sweep_local_steps"])) for k in cfg["leapfrog_sweep"]],
              "local_steps": [label(int(cfg["sweep_leapfrog"]), int(t)) for t in cfg["local_steps_sweep"]]}
    title = title + ("" if not run.quick else " (quick: subset, PCA)")
    figures = {"metrics_vs_rounds_leapfrog.png": partial(plot_group, results=results, names=groups["leapfrog"],
                                                         title=f"{title}, T = {cfg['sweep_local_steps']}, K varies"),
               "metrics_vs_rounds_local_steps.png": partial(plot_group, results=results, names=groups["local_steps"],
                                                            title=f"{title}, K = {cfg['sweep_leapfrog']}, T varies")}
    return Findings(
        settings=cfg,
        results={
            "clock": "leapfrog",
            "data": {**info, "model": model.name},
            "bma": f"draws of rounds floor({cfg['bma_burn_in']} r)+1 .. r of each run; mean and sd over runs",
            "groups": groups,
            "comparison": {"leapfrog": compare(results, groups["leapfrog"], label(1, int(cfg["sweep_local_steps"]))),
                           "local_steps": compare(results, groups["local_steps"], None)},
            "runs": results,
        },
        figures=figures)


_YLABELS = {"accuracy": "test accuracy (BMA)", "brier": "Brier score", "ece": "ECE", "nll": "NLL"}


def plot_group(path: Path, results: dict, names: list[str], title: str):
    """Four panels (accuracy, Brier, ECE, NLL) against rounds, one line per setting: the mean
    over runs, shaded +- one standard deviation (supplement L)."""
    fig, axes = figures.new_figure(ncols=4, figsize=(16, 3.8))
    for ax, m in zip(axes, METRICS):
        for name in names:
            r = results[name]
            mean, sd = np.asarray(r["mean"][m]), np.asarray(r["sd"][m])
            line, = ax.plot(r["rounds"], mean, "-", label=f"{name}, eta {r['step_size']:g}")
            ax.fill_between(r["rounds"], mean - sd, mean + sd, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel("communication rounds")
        ax.set_ylabel(_YLABELS[m])
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"FA-HMC on Fashion-MNIST, leapfrog clock: {title}")
    fig.tight_layout()
    figures.save_figure(fig, path)
