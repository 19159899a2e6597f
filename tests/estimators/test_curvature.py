"""Federated Hessian-vector power iteration, and one round of Hessians up to FULL_HESSIAN_DIM
parameters, against exact Hessians (``full_dim = 0``: the power iterations at any size)."""

import jax
import numpy as np
import pytest

from catalog import breast_cancer
from fedmcmc.data import from_clients
from fedmcmc.estimators.curvature import curvature
from fedmcmc.estimators.gradients import find_mode
from fedmcmc.models import linear_regression


def _exact_round(got, b, d):
    """One round of Hessians: every client's triangle up, theta down."""
    assert got.converged and (got.rounds, got.bits_up, got.bits_down) == (1, b * 32 * d * (d + 1) // 2, b * 32 * d)


@pytest.mark.slow
@pytest.mark.parametrize("full_dim", [None, 0])
def test_lambda_max_of_a_logistic_regression_is_the_exact_hessians(full_dim):
    data, model = breast_cancer(num_clients=4)
    mode = find_mode(model, data)
    got = curvature(jax.random.key(0), model, data, mode.theta, tol=1e-6, max_rounds=500, full_dim=full_dim)
    x, y = (np.concatenate(a).astype(np.float64)
            for a in zip(*(data.unpadded(i) for i in range(data.num_clients))))
    p = 1.0 / (1.0 + np.exp(-x @ np.asarray(mode.theta, np.float64)))
    hessian = x.T @ (x * (p * (1 - p))[:, None]) + np.eye(model.dim)  # N(0, 1) prior
    exact = np.linalg.eigvalsh(hessian)
    assert got.converged and got.lambda_min is None
    assert got.lambda_max == pytest.approx(exact[-1], rel=2e-3 if full_dim == 0 else 1e-5)
    if full_dim == 0:  # one round per product: d float32 to and from each of the b clients
        assert got.bits_up == got.bits_down == got.rounds * 4 * 32 * model.dim
    else:
        _exact_round(got, 4, model.dim)


@pytest.mark.parametrize("full_dim", [None, 0])
def test_both_ends_of_a_gaussian_models_spectrum(full_dim):
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
                    max_rounds_smallest=300, full_dim=full_dim)
    assert got.converged
    assert got.lambda_max == pytest.approx(exact[-1], rel=1e-4)
    assert got.lambda_min == pytest.approx(exact[0], rel=1e-2 if full_dim == 0 else 1e-5)
    if full_dim == 0:
        assert got.bits_up == got.bits_down == got.rounds * 3 * 32 * 4
    else:
        _exact_round(got, 3, 4)


def test_bad_settings_are_refused():
    data, model = breast_cancer(num_clients=2)
    with pytest.raises(ValueError, match="max_rounds"):
        curvature(jax.random.key(0), model, data, np.zeros(model.dim), max_rounds=1)
    with pytest.raises(ValueError, match="tol"):
        curvature(jax.random.key(0), model, data, np.zeros(model.dim), tol=0.0)


def test_heterogeneity_of_gaussian_means_is_the_closed_form():
    """Clients of n_c points x ~ N(theta, I), prior N(0, 4 I): f_c = U_0 + U_c / w_c has Hessian
    A_c = I / 4 + N I and gradient g_c = theta / 4 + N (theta - xbar_c) (w_c = n_c / N)."""
    from fedmcmc.estimators.curvature import heterogeneity
    from fedmcmc.models import gaussian_mean

    rng = np.random.default_rng(2)
    clients = [rng.normal(loc, 1.0, size=(n, 2)).astype(np.float32) for loc, n in ((-1.0, 30), (0.5, 50), (2.0, 20))]
    data = from_clients(clients)
    model = gaussian_mean(2, prior_scale=2.0)
    theta = np.array([0.3, -0.2])
    w, total = np.asarray(data.weights, np.float64), 100
    g = np.stack([theta / 4 + total * (theta - x.mean(axis=0)) for x in clients])
    got = heterogeneity(model, data, theta, data.weights)
    assert got.drift == pytest.approx(np.linalg.norm(w @ ((0.25 + total) * g)), rel=1e-4)
    assert got.spread == pytest.approx(np.linalg.eigvalsh((w[:, None] * g).T @ g)[-1], rel=1e-4)
    assert (got.rounds, got.bits_up, got.bits_down) == (1, 3 * 2 * 32 * 2, 3 * 32 * 2)


@pytest.mark.parametrize("kind", ["langevin", "leapfrog"])
def test_the_drift_offset_of_the_step_rules_is_the_averaged_mean_maps_fixed_point(kind):
    """On quadratic local potentials the exact fixed point of the clients' averaged mean map is
    off the mode by (beta / alpha) A^{-1} b to second order (fedmcmc.samplers.steps): T Langevin
    steps, (I - gamma A_c)^T, beta / alpha = (T - 1) gamma / 2; n trajectories of K leapfrog steps
    from fresh momenta, the position block of the leapfrog map to the n, (K eta)^2 (1/12 + (n - 1)/4)."""
    rng = np.random.default_rng(3)
    w = np.array([0.2, 0.3, 0.5])
    a = [np.diag(rng.uniform(0.5, 1.5, 2)) + 0.1 for _ in w]
    m = [rng.normal(0, 3, 2) for _ in w]
    big_a = sum(wc * ac for wc, ac in zip(w, a))
    star = np.linalg.solve(big_a, sum(wc * ac @ mc for wc, ac, mc in zip(w, a, m)))
    b = sum(wc * ac @ ac @ (star - mc) for wc, ac, mc in zip(w, a, m))
    if kind == "langevin":
        gamma, steps = 1e-3, 10
        maps = [np.linalg.matrix_power(np.eye(2) - gamma * ac, steps) for ac in a]
        ratio = (steps - 1) * gamma / 2
    else:
        eta, k, n = 1e-2, 5, 3
        maps = []
        for ac in a:
            x, p = np.eye(2), np.zeros((2, 2))
            for _ in range(k):
                p = p - eta / 2 * ac @ x
                x = x + eta * p
                p = p - eta / 2 * ac @ x
            maps.append(np.linalg.matrix_power(x, n))
        ratio = (k * eta) ** 2 * (1 / 12 + (n - 1) / 4)
    lhs = sum(wc * (np.eye(2) - mc_) for wc, mc_ in zip(w, maps))
    fixed = np.linalg.solve(lhs, sum(wc * (np.eye(2) - mc_) @ mc for wc, mc_, mc in zip(w, maps, m)))
    np.testing.assert_allclose(fixed - star, ratio * np.linalg.solve(big_a, b), rtol=0.05)


@pytest.mark.parametrize("full_dim", [None, 0])
def test_minibatch_noise_is_the_weighted_sum_of_the_points_squared_curvatures(full_dim):
    from fedmcmc.estimators.curvature import minibatch_noise

    rng = np.random.default_rng(5)
    clients = []
    for n in (40, 25, 300):  # the last client's rows span more than one chunk of per-point products
        x = rng.standard_normal((n, 3)) * rng.gamma(1.0, size=(n, 1))  # a few high-leverage rows
        clients.append((x.astype(np.float32), rng.standard_normal(n).astype(np.float32)))
    data, model = from_clients(clients), linear_regression(3, noise_scale=0.5)
    weights = np.array([2.0, 0.0, 0.5])
    exact = sum(w * sum(np.outer(r, r) * (r @ r) for r in np.asarray(c[0], np.float64)) / 0.25**2
                for w, c in zip(weights, clients))
    got = minibatch_noise(jax.random.key(0), model, data, np.zeros(3), weights, max_rounds=300, tol=1e-7,
                          full_dim=full_dim)
    assert got.converged
    assert got.lambda_max == pytest.approx(np.linalg.eigvalsh(exact)[-1], rel=1e-3 if full_dim == 0 else 1e-5)
    if full_dim == 0:
        assert got.bits_up == got.bits_down == got.rounds * 3 * 32 * 3
    else:
        _exact_round(got, 3, 3)


def test_the_mode_reports_each_clients_gradient_and_b_star():
    """Gaussian clients with a flat prior: grad U_i(theta*) = N_i (theta* - xbar_i), and in posterior
    sds (H^{-1} = I / N) the pulls are N_i^2 ||theta* - xbar_i||^2 / N."""
    from fedmcmc.app import problems
    from fedmcmc.estimators import gradients

    data, model, _ = problems.PROBLEMS["heterogeneous-gaussian"](num_clients=5, dim=3)
    mode = gradients.find_mode(model, data)
    theta = np.asarray(mode.theta, np.float64)
    counts = np.asarray(data.counts, np.float64)
    means = np.stack([np.asarray(data.unpadded(i), np.float64).mean(axis=0) for i in range(5)])
    exact = counts[:, None] * (theta - means)
    np.testing.assert_allclose(mode.client_grads, exact, rtol=1e-3, atol=1e-2 * np.abs(exact).max())
    record = gradients.heterogeneity(mode, np.eye(3) / counts.sum())
    assert record["b_star"] == pytest.approx(np.sum(exact**2), rel=1e-3)
    assert record["b_star_in_sds"] == pytest.approx(np.sum(exact**2) / counts.sum(), rel=1e-3)
    assert record["max_client_in_sds"] == pytest.approx(np.sqrt(np.max(np.sum(exact**2, 1)) / counts.sum()),
                                                        rel=1e-3)
    assert gradients.heterogeneity(mode._replace(client_grads=None)) is None
