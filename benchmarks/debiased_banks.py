"""Why de-biased FA-HMC samples a law tens of times too wide on four banks (docs/design.md, "The
posterior check and the chains' starting points"): the mean map of a round, linearised at the mode.

The four banks of ``fedmcmc example four-banks`` (the ISLR ``Default`` data sorted by income)
and their ``banks.toml``: a logistic regression (prior N(0, I)) on the standardised features, as
``fedmcmc run`` builds it. On quadratic local potentials ``f^(c)`` with Hessians
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

from fedmcmc.app import config
from fedmcmc.app.examples import four_banks
from fedmcmc.estimators.gradients import find_mode

#: (step, K, T): banks.toml's, shorter rounds, and the step of step_size = "auto".
SETTINGS = ((0.01, 10, 50), (0.01, 10, 10), (0.01, 10, 1), (6.7e-4, 10, 50))


def position_map(h: np.ndarray, eta: float, steps: int) -> np.ndarray:
    """The mean position after ``steps`` leapfrog steps from ``(x, 0)`` on the quadratic of Hessian ``h``."""
    x, p = np.eye(len(h)), np.zeros_like(h)
    for _ in range(steps):
        p = p - eta / 2 * h @ x
        x = x + eta * p
        p = p - eta / 2 * h @ x
    return x


def main(out: Path) -> None:
    four_banks(out)  # fedmcmc example four-banks
    _, built = config.from_text((out / "banks.toml").read_text(), out)
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
