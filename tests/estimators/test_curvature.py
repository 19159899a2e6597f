"""Federated Hessian-vector power iteration against exact Hessians."""

import jax
import numpy as np
import pytest

from catalog import breast_cancer
from fedmcmc.data import from_clients
from fedmcmc.estimators.curvature import curvature
from fedmcmc.estimators.gradients import find_mode
from fedmcmc.models import linear_regression


def test_lambda_max_of_a_logistic_regression_is_the_exact_hessians():
    data, model = breast_cancer(num_clients=4)
    mode = find_mode(model, data)
    got = curvature(jax.random.key(0), model, data, mode.theta, tol=1e-6, max_rounds=500)
    x, y = (np.concatenate(a).astype(np.float64)
            for a in zip(*(data.unpadded(i) for i in range(data.num_clients))))
    p = 1.0 / (1.0 + np.exp(-x @ np.asarray(mode.theta, np.float64)))
    hessian = x.T @ (x * (p * (1 - p))[:, None]) + np.eye(model.dim)  # N(0, 1) prior
    exact = np.linalg.eigvalsh(hessian)
    assert got.converged and got.lambda_min is None
    assert got.lambda_max == pytest.approx(exact[-1], rel=2e-3)
    # one round per product: d float32 to and from each of the b clients
    assert got.bits_up == got.bits_down == got.rounds * 4 * 32 * model.dim


def test_both_ends_of_a_gaussian_models_spectrum():
    rng = np.random.default_rng(1)
    scales = np.array([3.0, 1.0, 0.5, 0.2])  # a well-separated spectrum
    clients = []
    for n in (30, 50, 20):
        x = rng.standard_normal((n, 4)) * scales
        clients.append((x.astype(np.float32), (x @ np.ones(4) + rng.standard_normal(n)).astype(np.float32)))
    data = from_clients(clients)
    model = linear_regression(4, noise_scale=0.5, prior_scale=2.0)
    x = np.concatenate([c[0] for c in clients]).astype(np.float64)
    exact = np.linalg.eigvalsh(x.T @ x / 0.25 + np.eye(4) / 4.0)
    got = curvature(jax.random.key(3), model, data, np.zeros(4), tol=1e-7, smallest=True, max_rounds=300,
                    max_rounds_smallest=300)
    assert got.converged
    assert got.lambda_max == pytest.approx(exact[-1], rel=1e-4)
    assert got.lambda_min == pytest.approx(exact[0], rel=1e-2)
    assert got.bits_up == got.bits_down == got.rounds * 3 * 32 * 4


def test_bad_settings_are_refused():
    data, model = breast_cancer(num_clients=2)
    with pytest.raises(ValueError, match="max_rounds"):
        curvature(jax.random.key(0), model, data, np.zeros(model.dim), max_rounds=1)
    with pytest.raises(ValueError, match="tol"):
        curvature(jax.random.key(0), model, data, np.zeros(model.dim), tol=0.0)
