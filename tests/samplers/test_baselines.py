"""Baselines: pSGLD, DG-SGLD (DG-LMC) and FedAvg, against exact laws and closed forms.

Laws used, per coordinate, on the Gaussian-mean problem of :mod:`harness` (unit noise,
``U_i(z) = (N_i / 2)(z - xbar_i)^2``):

* pSGLD with ``beta = 1`` has a constant preconditioner ``g = 1 / (lambda + sqrt(v0))``: it is
  ``theta <- theta - (eps / 2) g (N (theta - xbar) + xi) + sqrt(eps g) Z``, whose stationary
  variance is ``(eps g + (eps g / 2)^2 s2) / (1 - (1 - eps g N / 2)^2)`` (``s2`` the variance
  of the minibatch noise ``xi``).
* DG-SGLD with exact or minibatch gradients is a linear recursion on ``[theta, z_1..z_b]`` with
  additive noise, whatever the participation mask: its stationary mean and second moment
  solve linear equations (:func:`dg_law`).
* FedAvg on quadratic local objectives is an affine map per round (:func:`fedavg_fixed_point`).
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc import from_clients, simulate
from fedmcmc.samplers import participation
from fedmcmc.core.base import Model
from fedmcmc.compression import quantization
from fedmcmc.models import gaussian_factors, gaussian_mean
from fedmcmc.runtime import round as rnd
from fedmcmc.samplers.dg_sgld import dg_sgld, quadratic_prior
from fedmcmc.estimators import scaffold
from fedmcmc.samplers.fedavg import FedAvgUpload, fedavg
from fedmcmc.samplers.psgld import psgld

DATA = h.problem()
MODEL = h.model_for(DATA)  # flat prior
MU = h.xbar(DATA)
N = DATA.total
D = MODEL.dim
SIZES = np.asarray(DATA.counts, float)
CLIENT_MEANS = np.stack([x.mean(axis=0) for x in h.client_arrays(DATA)])
BATCH = np.array([5, 7, 10, 16])


def client_noise(batch) -> np.ndarray:
    """``[b, d]``: per-coordinate variance of each client's minibatch gradient (zero if None)."""
    if batch is None:
        return np.zeros_like(CLIENT_MEANS)
    out = []
    for x, n in zip(h.client_arrays(DATA), np.broadcast_to(batch, (DATA.num_clients,))):
        big_n, n = x.shape[0], min(int(n), x.shape[0])
        out.append(big_n**2 * (1 - n / big_n) * x.var(axis=0, ddof=1) / n)
    return np.stack(out)


# ----------------------------------------------------------------------------------------- pSGLD


@pytest.mark.parametrize("batch", [None, 20])
def test_psgld_with_frozen_preconditioner_is_preconditioned_ula(batch):
    pooled = DATA.pooled()
    lam = 1e-5
    g = np.array([0.5, 1.0, 1.8])  # G per coordinate: eps g N / 2 = 0.25, 0.5, 0.9
    v0 = (1 / g - lam) ** 2
    eps = 1.0 / N
    sampler = psgld(MODEL, eps, batch_size=batch, beta=1.0, lam=lam, v0=v0)
    s2 = 0.0 if batch is None else h.minibatch_noise(pooled, [batch])
    var = (eps * g + (eps * g / 2) ** 2 * s2) / (1 - (1 - eps * g * N / 2) ** 2)
    samples = h.run(sampler, pooled)
    h.check_gaussian(samples, MU, var, f"pSGLD beta=1, batch {batch}")
    # power: the law with one common preconditioner (G = 1 on every coordinate) is rejected
    _, sq = h.chain_moments(samples, MU)
    se = sq.std(axis=0, ddof=1) / np.sqrt(sq.shape[0])
    assert np.all(np.abs(sq.mean(axis=0) - var[1])[[0, 2]] > 4 * h.Z * se[[0, 2]])


def drive(sampler, data, theta0, rounds: int, chains: int, seed=0):
    """Run the contract round by round (the runtime's round, every client active), returning
    every server state."""
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())
    b = data.num_clients
    ids = jnp.arange(b, dtype=jnp.uint32)
    everyone = jnp.ones((b,), bool)

    def chain(chain_key):
        server, broadcast = rnd.server_init(sampler, chain_key, theta0, b)
        cstates = rnd.client_init(sampler, chain_key, broadcast, clients, ids)

        def one(carry, k):
            server, broadcast, cstates = carry
            cstates, uploads, _ = rnd.client_round(sampler, chain_key, k, cstates, broadcast, clients, ids, everyone)
            server, broadcast, _ = rnd.server_round(sampler, chain_key, k, server, uploads, everyone, b)
            return (server, broadcast, cstates), server

        _, states = jax.lax.scan(one, (server, broadcast, cstates), jnp.arange(rounds))
        return server, states

    first, states = jax.jit(jax.vmap(chain))(rnd.chain_keys(seed, np.arange(chains)))
    return jax.tree_util.tree_map(np.asarray, first), jax.tree_util.tree_map(np.asarray, states)


def test_psgld_preconditioner_tracks_squared_gradients():
    """V follows beta V + (1 - beta) g^2 with g the mean per-point gradient at the previous
    position, and the move is exactly -(eps / 2) G grad U plus N(0, eps G) noise."""
    tau2, beta, lam = 4.0, 0.9, 1e-5
    model = gaussian_mean(D, prior_scale=np.sqrt(tau2))
    pooled = DATA.pooled()
    eps = 0.2 / N**1.5
    theta0 = MU + np.array([5.0, -3.0, 0.1])
    first, states = drive(psgld(model, eps, beta=beta, lam=lam), pooled, jnp.asarray(theta0, jnp.float32), 60, 200)
    prev = np.concatenate([np.broadcast_to(first.position[:, None], (200, 1, D)), states.position[:, :-1]], axis=1)
    prev = prev.astype(np.float64)
    g_bar = prev - MU  # grad U_lik / N for unit noise
    v_prev = np.concatenate([np.zeros((200, 1, D)), states.v[:, :-1]], axis=1)
    np.testing.assert_allclose(states.v, beta * v_prev + (1 - beta) * g_bar**2, rtol=2e-5, atol=1e-12)
    G = 1 / (lam + np.sqrt(states.v.astype(np.float64)))
    drift = N * (prev - MU) + prev / tau2
    resid = (states.position - (prev - 0.5 * eps * G * drift)) / np.sqrt(eps * G)
    z = resid.reshape(-1, D)
    h.assert_close(z, np.zeros(D), "normalised pSGLD noise mean")
    h.assert_close(z**2, np.ones(D), "normalised pSGLD noise variance")
    # adaptation: the steep coordinate (large first gradient) gets the small preconditioner
    assert np.all(G[:, 0, 0] * 10 < G[:, 0, 2])


# --------------------------------------------------------------------------------------- DG-SGLD


def dg_law(rho, gamma, steps, batch=None, prior_prec=0.0, probs=None, pause=True, server_step=None):
    """Exact stationary mean and variance of theta (per coordinate) for DG-SGLD on the harness
    problem, and the spectral radius of the first- and second-moment recursions.

    One round on one coordinate, for a participation mask: an active client's ``T_i`` steps give
    ``z' = a^T z + S (gamma r theta + gamma N_i xbar_i) + noise`` with ``a = 1 - gamma (N_i + r)``,
    ``S = sum_{s<T} a^s``, noise variance ``(2 gamma + gamma^2 s2_i) sum_{s<T} a^{2s}``; the server
    draws ``theta' ~ N((sum_i r_i z'_i) / q, 1 / q)``, ``q = prior_prec + sum_i r_i`` (exact), or
    takes ``theta' = (1 - h q) theta + h sum_i r_i z'_i + sqrt(2 h) Z`` (Langevin step ``h``).
    """
    b = DATA.num_clients
    rho, gamma, steps = (np.broadcast_to(np.asarray(v, float), (b,)) for v in (rho, gamma, steps))
    r = 1 / rho
    a = 1 - gamma * (SIZES + r)
    T = steps.astype(int)
    A, S, S2 = a**T, (1 - a**T) / (1 - a), (1 - a ** (2 * T)) / (1 - a**2)
    q = prior_prec + r.sum()
    probs = np.ones(b) if probs is None else np.broadcast_to(np.asarray(probs, float), (b,))
    s2 = client_noise(batch)
    n = b + 1
    means, variances, radius = [], [], 0.0
    for j in range(D):
        e_all = S * gamma * SIZES * CLIENT_MEANS[:, j]
        v_all = (2 * gamma + gamma**2 * s2[:, j]) * S2
        maps = []
        for mask in itertools.product([False, True], repeat=b):
            mask = np.asarray(mask)
            p = float(np.prod(np.where(mask, probs, 1 - probs)))
            if p == 0:
                continue
            if not mask.any() and pause:
                maps.append((p, np.eye(n), np.zeros(n), np.zeros((n, n))))
                continue
            Az, Cz = np.diag(np.where(mask, A, 1.0)), np.where(mask, S * gamma * r, 0.0)
            e, ve = np.where(mask, e_all, 0.0), np.where(mask, v_all, 0.0)
            if server_step is None:
                alpha, weights, vn = 0.0, r / q, 1 / q
            else:
                alpha, weights, vn = 1 - server_step * q, server_step * r, 2 * server_step
            M = np.zeros((n, n))
            M[0, 0], M[0, 1:], M[1:, 0], M[1:, 1:] = alpha + weights @ Cz, weights @ Az, Cz, Az
            m = np.concatenate([[weights @ e], e])
            J = np.zeros((n, n))
            J[0, :b], J[0, b], J[1:, :b] = weights, 1.0, np.eye(b)
            maps.append((p, M, m, J @ np.diag(np.r_[ve, vn]) @ J.T))
        m_bar = sum(p * M for p, M, _, _ in maps)
        mu = np.linalg.solve(np.eye(n) - m_bar, sum(p * m for p, _, m, _ in maps))
        K = sum(p * np.kron(M, M) for p, M, _, _ in maps)
        rhs = sum(p * (np.outer(M @ mu, m) + np.outer(m, M @ mu) + np.outer(m, m) + Q) for p, M, m, Q in maps)
        R = np.linalg.solve(np.eye(n * n) - K, rhs.ravel()).reshape(n, n)
        means.append(mu[0])
        variances.append(R[0, 0] - mu[0] ** 2)
        radius = max(radius, np.abs(np.linalg.eigvals(m_bar)).max(), np.abs(np.linalg.eigvals(K)).max())
    return np.array(means), np.array(variances), radius


@pytest.mark.slow
def test_dg_sgld_one_round_kernels():
    """One client visit: z' = a^T z + S gamma (r theta + N_i xbar_i) + noise of variance
    (2 gamma + gamma^2 s2_i) sum_{s<T} a^{2s}, for each client's own T_i, rho_i, gamma_i and
    minibatch; one server draw: theta ~ N((c + sum_i z_i / rho_i) / q, 1 / q) with the last z_i
    of the inactive clients."""
    tau2 = 2.0
    model = gaussian_mean(D, prior_scale=np.sqrt(tau2), prior_mean=0.5)
    rho = np.array([0.05, 0.03, 0.08, 0.05])
    steps = np.array([1, 2, 5, 3])
    gamma = 0.3 / (SIZES + 1 / rho)
    sampler = dg_sgld(model, rho, gamma, steps, batch_size=BATCH)
    theta = jnp.asarray(MU + 0.3, jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(3), 20_000)
    s2 = client_noise(BATCH)
    for i in range(DATA.num_clients):
        z0 = jnp.asarray(MU - 1.0, jnp.float32)
        cd = jax.tree_util.tree_map(jnp.asarray, DATA.client(i))
        state = sampler.client_init(None, sampler.init(None, theta)[1], cd)._replace(z=z0)
        _, z, info = jax.jit(jax.vmap(lambda k: sampler.client_step(k, state, sampler.init(None, theta)[1], cd, 0)))(keys)
        a = 1 - gamma[i] * (SIZES[i] + 1 / rho[i])
        T = steps[i]
        mean = a**T * np.asarray(z0) + (1 - a**T) / (1 - a) * gamma[i] * (np.asarray(theta) / rho[i] + SIZES[i] * CLIENT_MEANS[i])
        var = (2 * gamma[i] + gamma[i] ** 2 * s2[i]) * (1 - a ** (2 * T)) / (1 - a**2)
        z = np.asarray(z, np.float64)
        h.assert_close(z, mean, f"client {i} z mean")
        h.assert_close((z - mean) ** 2, var, f"client {i} z variance")
        assert np.all(np.asarray(info.bits) == 32 * D)
    # server: rows of inactive clients are the stored ones
    stored = jnp.asarray(np.random.default_rng(0).normal(size=(4, D)), jnp.float32)
    uploads = stored + 1.0
    mask = jnp.asarray([True, False, True, False])
    state = sampler.init(None, theta)[0]._replace(z=stored)
    new, _, _ = jax.jit(jax.vmap(lambda k: sampler.server_step(k, state, uploads, mask, 0)))(keys)
    z_used = np.where(np.asarray(mask)[:, None], np.asarray(uploads), np.asarray(stored))
    np.testing.assert_array_equal(np.asarray(new.z[0]), z_used)
    q = 1 / tau2 + np.sum(1 / rho)
    mean = (0.5 / tau2 + (z_used / rho[:, None]).sum(axis=0)) / q
    pos = np.asarray(new.position, np.float64)
    h.assert_close(pos, mean, "server theta mean")
    h.assert_close((pos - mean) ** 2, np.full(D, 1 / q), "server theta variance")


@pytest.mark.slow
def test_dg_sgld_exact_gibbs_matches_its_stationary_law():
    """Per-client tolerances, steps and local step counts, minibatches, Gaussian prior."""
    tau2 = 1.0
    model = gaussian_mean(D, prior_scale=np.sqrt(tau2))
    rho = np.array([0.05, 0.03, 0.08, 0.05])
    steps = np.array([2, 3, 4, 3])
    gamma = 0.3 / (SIZES + 1 / rho)
    mean, var, radius = dg_law(rho, gamma, steps, BATCH, prior_prec=1 / tau2)
    assert radius**100 < 1e-6  # burn-in of 100 rounds forgets the start
    sampler = dg_sgld(model, rho, gamma, steps, batch_size=BATCH)
    h.check_gaussian(h.run(sampler, DATA), mean, var, "DG-SGLD exact Gibbs")
    # power: the law is far from the posterior at these tolerances (the augmentation bias)
    assert np.max(np.abs(mean - MU)) * np.sqrt(N) > 3 and var[0] * N > 2


@pytest.mark.slow
def test_dg_sgld_partial_participation_and_langevin_server_step():
    p, rho, steps = 0.6, 0.05, 3
    gamma = 0.3 / (SIZES + 1 / rho)
    step = 0.3 / (DATA.num_clients / rho)
    scheme = participation.bernoulli(p, "active")
    mean, var, radius = dg_law(rho, gamma, steps, probs=p, pause=True, server_step=step)
    assert radius**100 < 1e-6
    sampler = dg_sgld(MODEL, rho, gamma, steps, num_clients=4, participation=scheme, prior_step_size=step)
    res = simulate(0, sampler, DATA, MU, 400, num_chains=1000, burn_in=100)
    h.check_gaussian(res.samples, mean, var, "DG-SGLD partial participation, Langevin theta step")
    # bits: every active client uploads z_i (32 bits a float) and receives theta
    np.testing.assert_array_equal(res.bits_up, res.active * 32 * D)
    np.testing.assert_array_equal(res.bits_down, res.active * 32 * D)
    assert 0.5 < res.active.mean() / DATA.num_clients < 0.7


@pytest.mark.slow
def test_dg_sgld_approaches_the_posterior_as_rho_vanishes():
    """Tolerance: mean within 0.2 posterior sd of the posterior mean and variance within 10% of
    the posterior's (plus 5 s.e.). rho = 2e-4 with small client steps passes; the exact law
    says rho = 0.01 fails both by far, so the check can fail."""
    post_var = 1.0 / N

    def within(mean, var, se_mean=0.0, se_var=0.0):
        return (np.all(np.abs(mean - MU) <= 0.2 * np.sqrt(post_var) + h.Z * se_mean)
                and np.all(np.abs(var - post_var) <= 0.1 * post_var + h.Z * se_var))

    rho, steps = 2e-4, 10
    gamma = 0.1 / (SIZES + 1 / rho)
    law_mean, law_var, _ = dg_law(rho, gamma, steps)
    assert within(law_mean, law_var)
    bad = dg_law(1e-2, 0.1 / (SIZES + 1e2), steps)
    assert np.max(np.abs(bad[0] - MU)) > 0.5 * np.sqrt(post_var) and np.all(bad[1] > 1.3 * post_var)

    chains = 500
    theta0 = MU + np.sqrt(post_var) * np.random.default_rng(1).standard_normal((chains, D))
    sampler = dg_sgld(MODEL, rho, gamma, steps, num_clients=4)
    samples = simulate(0, sampler, DATA, theta0, 1200, num_chains=chains, burn_in=200).samples
    means, sq = h.chain_moments(samples, MU)
    se = lambda x: x.std(axis=0, ddof=1) / np.sqrt(chains)  # noqa: E731
    assert within(means.mean(axis=0), sq.mean(axis=0), se(means), se(sq)), (means.mean(0) - MU, sq.mean(0) * N)


@pytest.mark.slow
def test_quadratic_prior_detection():
    P = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 3.0]])
    c = np.array([0.3, -1.0, 0.5])
    base = gaussian_mean(3)

    def with_prior(log_prior):
        return Model(base.log_likelihood, log_prior, 3, name="test")

    full = quadratic_prior(with_prior(lambda t: -0.5 * t @ jnp.asarray(P, jnp.float32) @ t + t @ jnp.asarray(c, jnp.float32)))
    np.testing.assert_allclose(full.precision, P, rtol=1e-5)
    np.testing.assert_allclose(full.shift, c, rtol=1e-6)
    diag = quadratic_prior(gaussian_mean(3, prior_scale=2.0, prior_mean=1.0))
    np.testing.assert_allclose(diag.precision, np.full(3, 0.25), rtol=1e-5)
    np.testing.assert_allclose(diag.shift, np.full(3, 0.25), rtol=1e-5)
    np.testing.assert_array_equal(quadratic_prior(base).precision, np.zeros(3))
    laplace = with_prior(lambda t: -jnp.sum(jnp.abs(t)))
    assert quadratic_prior(laplace) is None
    with pytest.raises(ValueError, match="not Gaussian or flat"):
        dg_sgld(laplace, 0.1, 0.01, num_clients=2)
    dg_sgld(laplace, 0.1, 0.01, num_clients=2, prior_step_size=0.01)  # fine with a Langevin theta step


# ---------------------------------------------------------------------------------------- FedAvg

# Three heterogeneous clients with quadratic objectives F_c = (lam_c / 2)||theta - mu_c||^2
LAM = np.array([1.0, 0.25, 2.0])
CENTRES = np.array([[4.0, 0.0], [-2.0, 1.0], [1.0, -3.0]])
COUNTS = (1, 2, 3)
W = np.asarray(COUNTS, float) / sum(COUNTS)


def factor_data():
    return from_clients([(np.tile(mu, (n, 1)), np.full((n,), lam)) for lam, mu, n in zip(LAM, CENTRES, COUNTS)])


def fedavg_fixed_point(eta, steps):
    """T local GD steps: theta_c = mu_c + a_c^T (theta - mu_c), a_c = 1 - eta lam_c; averaging
    with weights w_c gives theta' = A theta + B, with the fixed point B / (1 - A)."""
    shrink = (1 - eta * LAM) ** steps
    return (W * (1 - shrink)) @ CENTRES / np.sum(W * (1 - shrink))


def test_fedavg_one_local_step_is_gradient_descent():
    tau2, eta = 4.0, 0.05
    model = gaussian_mean(D, prior_scale=np.sqrt(tau2))
    rounds = 30
    res = simulate(0, fedavg(model, DATA.weights, eta), DATA, np.zeros(D), rounds)
    total = np.concatenate(h.client_arrays(DATA)).sum(axis=0)
    theta, path = np.zeros(D), []
    for _ in range(rounds):
        theta = theta - eta * (N * theta - total + theta / tau2) / N  # grad U / n, prior counted once
        path.append(theta)
    np.testing.assert_allclose(res.samples[0], np.array(path), rtol=1e-5, atol=1e-5)
    # bits: 32 per float each way, for every client every round
    assert res.total_bits_up[0] == rounds * DATA.num_clients * 32 * D
    assert res.total_bits_down[0] == rounds * DATA.num_clients * 32 * D


def test_fedavg_several_local_steps_converge_to_the_drifted_fixed_point():
    data, model = factor_data(), gaussian_factors(2)
    eta, steps = 0.3, 10
    res = simulate(0, fedavg(model, W, eta, steps), data, np.zeros(2), 80)
    fixed = fedavg_fixed_point(eta, steps)
    np.testing.assert_allclose(res.samples[0, -1], fixed, rtol=1e-5, atol=1e-5)
    mode = (W * LAM) @ CENTRES / np.sum(W * LAM)  # the MAP: where one local step converges
    np.testing.assert_allclose(fedavg_fixed_point(eta, 1), mode, rtol=1e-12)
    assert np.max(np.abs(fixed - mode)) > 0.3  # client drift: T > 1 does not find the MAP
    # SCAFFOLD's control variates remove the drift: the MAP is the fixed point for every T
    corrected = simulate(0, fedavg(model, W, eta, steps, control_variates=scaffold.scaffold()), data, np.zeros(2), 80)
    np.testing.assert_allclose(corrected.samples[0, -1], mode, rtol=1e-5, atol=1e-5)
    assert corrected.total_bits_up[0] == 2 * res.total_bits_up[0]  # h_c rides with the change


@pytest.mark.slow
def test_fedavg_aggregation_and_compression():
    data, model = factor_data(), gaussian_factors(2)
    theta = jnp.asarray([0.5, -1.0])
    deltas = jnp.asarray([[1.0, 2.0], [3.0, -1.0], [-2.0, 0.5]])
    mask = jnp.asarray([True, False, True])
    scheme = participation.bernoulli([0.5, 0.5, 0.8], "inverse_probability")
    for aggregation, weights in (("mcmahan", np.array([W[0], 0, W[2]]) / (W[0] + W[2])),
                                 ("unbiased", np.array([W[0] / 0.5, 0, W[2] / 0.8]))):
        sampler = fedavg(model, W, 0.1, participation=scheme, aggregation=aggregation)
        state, _ = sampler.init(None, theta)
        new, _, _ = sampler.server_step(None, state, FedAvgUpload(deltas), mask, 0)
        np.testing.assert_allclose(new.position, theta + weights @ np.asarray(deltas), rtol=1e-6)
        empty, _, _ = sampler.server_step(None, state, FedAvgUpload(deltas), jnp.zeros(3, bool), 0)
        np.testing.assert_array_equal(empty.position, theta)
    # compressed uploads: unbiased, so the iterates still approach the fixed point, and cheaper
    plain = simulate(0, fedavg(model, W, 0.3, 1), data, np.zeros(2), 100, num_chains=200)
    quant = simulate(0, fedavg(model, W, 0.3, 1, compressor=quantization(8)), data, np.zeros(2), 100, num_chains=200)
    assert quant.total_bits_up[0] < plain.total_bits_up[0] == 100 * 3 * 32 * 2
    last = quant.samples[:, -50:].reshape(-1, 2)
    assert np.all(np.abs(last.mean(axis=0) - (W * LAM) @ CENTRES / np.sum(W * LAM)) < 0.05)


# ----------------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("build, message", [
    (lambda: psgld(MODEL, 0.0), "step_size must be > 0"),
    (lambda: psgld(MODEL, 1e-3, beta=1.5), "beta must lie in"),
    (lambda: psgld(MODEL, 1e-3, lam=0.0), "lam must be"),
    (lambda: psgld(MODEL, 1e-3, beta=1.0), "give v0"),
    (lambda: psgld(MODEL, 1e-3, v0=[-1.0, 0, 0]), "v0 must be >= 0"),
    (lambda: psgld(MODEL, 1e-3, v0=[1.0, 1.0]), "dimension"),
    (lambda: psgld(MODEL, 1e-3, batch_size=0), "batch_size"),
    (lambda: dg_sgld(MODEL, 0.0, 1e-3, num_clients=4), "rho"),
    (lambda: dg_sgld(MODEL, 0.1, -1e-3, num_clients=4), "step_size"),
    (lambda: dg_sgld(MODEL, 0.1, 1e-3, 0, num_clients=4), "num_local_steps"),
    (lambda: dg_sgld(MODEL, 0.1, 1e-3, 1.5, num_clients=4), "num_local_steps"),
    (lambda: dg_sgld(MODEL, 0.1, 1e-3), "number of clients"),
    (lambda: dg_sgld(MODEL, [0.1, 0.2], [1e-3] * 3), "different lengths"),
    (lambda: dg_sgld(MODEL, 0.1, 1e-3, num_clients=4, prior_step_size=1.0), "unstable"),
    (lambda: dg_sgld(MODEL, 0.1, 1e-3, num_clients=4, prior_step_size=-1.0), "prior_step_size"),
    (lambda: fedavg(MODEL, [0.5, 0.6], 0.1), "sum to 1"),
    (lambda: fedavg(MODEL, [0.5, 0.5], 0.0), "step_size must be > 0"),
    (lambda: fedavg(MODEL, [0.5, 0.5], 0.1, local_steps=0), "local_steps"),
    (lambda: fedavg(MODEL, [0.5, 0.5], 0.1, aggregation="mean"), "unknown aggregation"),
])
def test_bad_inputs_are_rejected(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_per_client_settings_must_fit_the_data():
    sampler = dg_sgld(MODEL, [0.1, 0.1, 0.1], 1e-3)
    with pytest.raises(ValueError, match="per-client settings for 3 clients"):
        simulate(0, sampler, DATA, MU, 2)
    res = simulate(0, psgld(MODEL, 1e-4), DATA.pooled(), MU, 4)
    assert res.total_bits_up[0] == 0 and res.total_bits_down[0] == 0
