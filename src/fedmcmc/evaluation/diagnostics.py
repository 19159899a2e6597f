"""MCMC diagnostics through ArviZ, with explicit chain and draw axes: R-hat and ESS per coordinate,
the per-parameter report with its warnings (:func:`convergence`), trace and rank plots."""

from __future__ import annotations

import warnings

import numpy as np


def _az():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def rhat(samples: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat per coordinate of ``samples[chain, draw, d]``."""
    az = _az()
    return np.asarray(az.rhat(az.convert_to_dataset(samples))["x"])


def ess(samples: np.ndarray) -> np.ndarray:
    """Bulk effective sample size per coordinate of ``samples[chain, draw, d]``."""
    az = _az()
    return np.asarray(az.ess(az.convert_to_dataset(samples))["x"])


def summary(samples: np.ndarray) -> dict:
    """Worst-coordinate R-hat and ESS: what a user checks first."""
    if samples.shape[1] < 4:
        return {"max_rhat": None, "min_ess": None}
    return {"max_rhat": float(np.max(rhat(samples))), "min_ess": float(np.min(ess(samples)))}


#: The thresholds of :func:`convergence`'s warnings: Vehtari, Gelman, Simpson, Carpenter &
#: Bürkner, "Rank-normalization, folding, and localization: an improved R-hat for assessing
#: convergence of MCMC", Bayesian Analysis 2021 (R-hat below 1.01, bulk ESS above 100 per chain
#: for four chains).
RHAT_MAX = 1.01
ESS_MIN = 400
#: Chains whose lag-1 autocorrelation (median over chains, of the worst parameter) is above this
#: have barely moved between draws: their steps are small against the posterior's scale, and a
#: smaller step would not help them agree.
SLOW_AUTOCORRELATION = 0.95


def convergence(posterior, rhat_max: float = RHAT_MAX, ess_min: float = ESS_MIN) -> dict:
    """R-hat, bulk and tail ESS per parameter, and the warnings a user must read.

    Parameters
    ----------
    posterior
        An InferenceData (its ``posterior``), an xarray Dataset, or draws ``[chain, draw, d]``.
    rhat_max, ess_min
        A warning is given when some parameter has R-hat above ``rhat_max`` (or undefined) or
        bulk ESS below ``ess_min``.

    Returns
    -------
    dict
        ``parameters``: ``{label: {"r_hat", "ess_bulk", "ess_tail"}}`` with ArviZ's labels
        (``theta[3]``, ``W[0, 1]``) in the order of the flat parameter; ``max_r_hat``,
        ``min_ess_bulk``, ``min_ess_tail``; ``warnings``: a list of one-line messages.
    """
    az = _az()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # too few draws: NaN, reported below
        table = az.summary(posterior, kind="diagnostics", round_to="none")
    params = {str(label): {"r_hat": float(row["r_hat"]), "ess_bulk": float(row["ess_bulk"]),
                           "ess_tail": float(row["ess_tail"])} for label, row in table.iterrows()}
    r, bulk = table["r_hat"].to_numpy(float), table["ess_bulk"].to_numpy(float)
    labels = list(params)
    found = []
    bad = ~(r <= rhat_max)
    if bad.any():
        worst = int(np.nanargmax(np.where(np.isnan(r), np.inf, r)))
        lag1 = _lag1(_draws(az, posterior)[..., worst])
        advice = ("run more iterations, more burn-in or a smaller step size" if lag1 <= SLOW_AUTOCORRELATION else
                  f"they have barely moved (lag-1 autocorrelation {lag1:.3f}), so the steps are small against the "
                  'posterior\'s scale: run more iterations (a step the curvature or the clients\' drift made small '
                  'needs many), or with a given step try step_size = "auto", which also whitens the posterior')
        found.append(f"R-hat > {rhat_max} (or undefined) for {bad.sum()} of {len(r)} parameters (worst "
                     f"{labels[worst]}: {r[worst]:.4f}): the chains disagree; {advice}")
    low = ~(bulk >= ess_min)
    if low.any():
        worst = int(np.nanargmin(np.where(np.isnan(bulk), -np.inf, bulk)))
        found.append(f"bulk ESS < {ess_min:g} for {low.sum()} of {len(bulk)} parameters (smallest "
                     f"{labels[worst]}: {bulk[worst]:.0f}): too few effective draws for reliable summaries; "
                     "run more iterations")
    tail = table["ess_tail"].to_numpy(float)
    return {"parameters": params, "max_r_hat": _defined(np.nanmax, r), "min_ess_bulk": _defined(np.nanmin, bulk),
            "min_ess_tail": _defined(np.nanmin, tail), "warnings": found}


def _draws(az, posterior) -> np.ndarray:
    """``[chain, draw, parameter]``, the parameters in the order of ArviZ's summary."""
    ds = az.convert_to_dataset(posterior)
    return np.concatenate([np.asarray(ds[v]).reshape(ds[v].shape[:2] + (-1,)) for v in ds.data_vars], axis=-1)


def _lag1(x: np.ndarray) -> float:
    """The median over chains of the lag-1 autocorrelation of ``x[chain, draw]`` (1 for a chain
    that does not move at all)."""
    c = x - x.mean(axis=1, keepdims=True)
    total = np.sum(c * c, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(total > 0, np.sum(c[:, 1:] * c[:, :-1], axis=1) / total, 1.0)
    return float(np.median(rho))


def _defined(reduce, values: np.ndarray) -> float | None:
    """``reduce`` over the defined values, None if there is none."""
    return float(reduce(values)) if np.isfinite(values).any() else None


def _worst(report: dict, count: int) -> list[int]:
    """Indices of the ``count`` parameters with the largest R-hat (undefined first)."""
    r = np.array([p["r_hat"] for p in report["parameters"].values()])
    return list(np.argsort(-np.where(np.isnan(r), np.inf, r), kind="stable")[:count])


def plot_trace(path, samples: np.ndarray, report: dict, count: int = 4):
    """Trace (left) and per-chain marginal histogram (right) of the ``count`` parameters with the
    largest R-hat of ``report`` (:func:`convergence` of the same draws ``[chain, draw, d]``)."""
    from fedmcmc.core.figures import new_figure, save_figure

    labels = list(report["parameters"])
    picked = _worst(report, count)
    fig, axes = new_figure(nrows=len(picked), ncols=2, figsize=(9, 2.2 * len(picked)), squeeze=False)
    fig.set_layout_engine("constrained")
    for row, k in zip(axes, picked):
        for c in range(samples.shape[0]):
            row[0].plot(samples[c, :, k], lw=0.6)
            # float64: float32 draws of a chain that barely moved cannot be cut into 30 bins
            row[1].hist(np.asarray(samples[c, :, k], np.float64), bins=30, density=True, histtype="step")
        row[0].set_ylabel(labels[k], fontsize=8)
        row[1].set_title(f"R-hat {report['parameters'][labels[k]]['r_hat']:.3f}", fontsize=8)
    axes[-1][0].set_xlabel("stored draw")
    return save_figure(fig, path)


def plot_rank(path, samples: np.ndarray, report: dict, count: int = 4, bins: int = 20):
    """Rank plots (Vehtari et al. 2021): for each of the ``count`` parameters with the largest
    R-hat, the histogram of each chain's ranks among all draws; mixed chains give flat histograms."""
    from scipy.stats import rankdata

    from fedmcmc.core.figures import new_figure, save_figure

    labels = list(report["parameters"])
    picked = _worst(report, count)
    chains, draws = samples.shape[:2]
    fig, axes = new_figure(nrows=len(picked), ncols=1, figsize=(6, 1.8 * len(picked)), squeeze=False)
    fig.set_layout_engine("constrained")
    edges = np.linspace(0, chains * draws, bins + 1)
    for (ax,), k in zip(axes, picked):
        ranks = rankdata(samples[..., k].ravel()).reshape(chains, draws)
        for c in range(chains):
            ax.stairs(np.histogram(ranks[c], edges)[0], edges, label=f"chain {c}")
        ax.axhline(draws / bins, color="k", ls="--", lw=0.8)
        ax.set_ylabel(labels[k], fontsize=8)
    axes[0][0].legend(fontsize=7, ncols=min(chains, 4))
    axes[-1][0].set_xlabel("rank among all draws")
    return save_figure(fig, path)
