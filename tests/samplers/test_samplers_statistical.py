"""Every sampler against the stationary law of its discretised chain (see harness.py)."""

import numpy as np
import pytest

import harness as h
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation
from fedmcmc.compression import quantization
from fedmcmc.samplers import lsd_pp, lsd_star, qlsd_pp, qlsd_sharp, qlsd_star, sgld

DATA = h.problem()
MODEL = h.model_for(DATA)
MU = h.xbar(DATA)
N = DATA.total
GAMMA = 0.5 / N  # gamma N = 0.5: far from the posterior (variance 1 / N), fast mixing
BATCH = np.array([5, 7, 10, 16])


def test_full_gradient_qlsd_is_ula_in_law():
    samples = h.run(qlsd_sharp(MODEL, GAMMA), DATA)
    h.check_gaussian(samples, MU, h.ula_variance(GAMMA, N), "QLSD identity full batch")
    # power: the discretised law is far from the posterior, and the test would see it
    _, sq = h.chain_moments(samples, MU)
    assert np.all(np.abs(sq.mean(axis=0) - 1 / N) > 20 * sq.std(axis=0) / np.sqrt(sq.shape[0]))


def test_qlsd_sharp_minibatch_noise():
    samples = h.run(qlsd_sharp(MODEL, GAMMA, BATCH), DATA)
    h.check_gaussian(samples, MU, h.minibatch_variance(GAMMA, DATA, BATCH), "QLSD# uncompressed")


def test_sgld_centralised():
    pooled = DATA.pooled()
    samples = h.run(sgld(MODEL, GAMMA, 20), pooled)
    h.check_gaussian(samples, MU, h.minibatch_variance(GAMMA, pooled, [20]), "SGLD")


def test_inverse_probability_participation():
    p = np.array([0.9, 0.7, 0.8, 0.6])
    sampler = qlsd_sharp(MODEL, GAMMA, participation=participation.bernoulli(p, "inverse_probability"))
    samples = h.run(sampler, DATA)
    h.check_gaussian(samples, MU, h.inverse_probability_variance(GAMMA, DATA, p), "1/p_i participation")


def test_active_scaling_participation_pauses_on_empty_rounds():
    p = 0.5
    sampler = qlsd_sharp(MODEL, GAMMA, participation=participation.bernoulli(p, "active"))
    samples = h.run(sampler, DATA, iterations=600)
    h.check_gaussian(samples, MU, h.active_scaling_variance(GAMMA, DATA, p), "b/|A| participation")


@pytest.mark.slow
@pytest.mark.parametrize("batch", [None, BATCH])
def test_lsd_star_and_lsd_pp_are_exact_gradient_chains(batch):
    # On this model grad U_ij(theta) - grad U_ij(theta*) = theta - theta*: no minibatch noise.
    mode = gradients.find_mode(MODEL, DATA)
    for sampler in (lsd_star(MODEL, GAMMA, mode, batch), lsd_pp(MODEL, GAMMA, batch, refresh_every=7)):
        samples = h.run(sampler, DATA, chains=600)
        h.check_gaussian(samples, MU, h.ula_variance(GAMMA, N), sampler.name)


def qsgd_noise(v: np.ndarray, s: int) -> np.ndarray:
    """E||C(v) - v||^2 = (||v|| / s)^2 sum_k f_k (1 - f_k), over the last axis."""
    norm = np.linalg.norm(v, axis=-1, keepdims=True)
    r = s * np.abs(v) / np.where(norm > 0, norm, 1)
    f = r - np.floor(r)
    return (norm[..., 0] / s) ** 2 * np.sum(f * (1 - f), axis=-1)


@pytest.mark.slow
def test_qlsd_star_compressed_stationarity_identity():
    """(1 - (1 - gamma N)^2) E||theta - mu||^2 = 2 gamma d + gamma^2 E sum_i noise_i(theta),
    with client i compressing v_i = N_i (theta - theta*) with s = 1 level."""
    s = 1
    mode = gradients.find_mode(MODEL, DATA)
    samples = h.run(qlsd_star(MODEL, GAMMA, mode, BATCH, quantization(s)), DATA).astype(np.float64)
    means, _ = h.chain_moments(samples, MU)
    h.assert_close(means, MU, "QLSD* mean")
    sizes = np.asarray(DATA.counts, float)
    v = sizes[None, None, :, None] * (samples[:, :, None, :] - np.asarray(mode.theta, np.float64))
    noise = qsgd_noise(v, s).sum(axis=-1)  # [chain, draw]
    d = samples.shape[-1]
    residual = (h.contraction(GAMMA, N) * ((samples - MU) ** 2).sum(-1) - 2 * GAMMA * d - GAMMA**2 * noise)
    _, se = h.assert_close(residual.mean(axis=1), 0.0, "QLSD* stationarity identity")
    # power: leaving the compression term out (or getting its scale wrong by half) would fail
    assert 0.5 * GAMMA**2 * noise.mean() > 2 * h.Z * se


@pytest.mark.slow
@pytest.mark.parametrize("make", ["qlsd_sharp", "qlsd_pp_memory", "qlsd_pp_no_memory"])
def test_compressed_samplers_are_unbiased_and_noisier_than_ula(make):
    q = quantization(4)
    sampler = {
        "qlsd_sharp": lambda: qlsd_sharp(MODEL, GAMMA, BATCH, q),
        "qlsd_pp_memory": lambda: qlsd_pp(MODEL, GAMMA, BATCH, q, refresh_every=10),
        "qlsd_pp_no_memory": lambda: qlsd_pp(MODEL, GAMMA, BATCH, q, refresh_every=10, memory=False),
    }[make]()
    samples = h.run(sampler, DATA)
    means, sq = h.chain_moments(samples, MU)
    h.assert_close(means, MU, f"{make} mean")
    floor = h.minibatch_variance(GAMMA, DATA, BATCH) if make == "qlsd_sharp" else h.ula_variance(GAMMA, N)
    m, se = sq.mean(axis=0), sq.std(axis=0, ddof=1) / np.sqrt(sq.shape[0])
    assert np.all(m >= floor - h.Z * se), f"{make}: variance {m} below the uncompressed chain's {floor}"


@pytest.mark.slow
def test_memory_reduces_compression_noise():
    """QLSD++'s point: with memory terms the compressed quantity g_i - eta_i shrinks, so the
    chain is closer to the uncompressed one than without memory (Vono et al., Sec. 3.3)."""
    q = quantization(1)
    with_mem = h.run(qlsd_pp(MODEL, GAMMA, None, q, refresh_every=10), DATA, chains=500)
    without = h.run(qlsd_pp(MODEL, GAMMA, None, q, refresh_every=10, memory=False), DATA, chains=500)
    _, a = h.chain_moments(with_mem, MU)
    _, b = h.chain_moments(without, MU)
    se = np.sqrt(a.var(axis=0, ddof=1) / a.shape[0] + b.var(axis=0, ddof=1) / b.shape[0])
    assert np.all(b.mean(axis=0) - a.mean(axis=0) > h.Z * se)


def s45_lsd_pp_law(data, gamma, p, rate):
    """The exact stationary mean and per-coordinate variance of LSD++ with full batches, 1/p_i
    participation and memory rate ``rate`` on the active clients (flat prior), or None if the
    chain has none. Per coordinate the state ``z = (theta, eta_1..eta_b)`` moves by the affine map
    ``z' = A(m) z + c(m) + sqrt(2 gamma) Z e_0`` of the round's mask ``m`` (independent of ``z``):
    ``g = sum_j eta_j + sum_i (m_i / p_i)(N_i (theta - xbar_i) - eta_i)``, ``theta' = theta - gamma g``,
    ``eta_i' = eta_i + rate_i m_i (N_i (theta - xbar_i) - eta_i)``; the first and second moments
    solve linear equations, summed over the 2^b masks."""
    import itertools

    arrays = h.client_arrays(data)
    b = len(arrays)
    sizes = np.array([x.shape[0] for x in arrays], float)
    means = np.stack([x.mean(axis=0) for x in arrays])  # [b, d]
    p, rate = np.broadcast_to(np.asarray(p, float), (b,)), np.broadcast_to(np.asarray(rate, float), (b,))
    masks = np.array(list(itertools.product((0.0, 1.0), repeat=b)))
    weights = np.prod(np.where(masks > 0, p, 1 - p), axis=1)
    n = b + 1
    out_mean, out_var = [], []
    for coord in range(means.shape[1]):
        xb = means[:, coord]
        mats, shifts = [], []
        for m in masks:
            a = np.eye(n)
            a[0, 0] -= gamma * np.sum(m / p * sizes)
            a[0, 1:] = -gamma * (1 - m / p)
            a[1:, 0] = rate * m * sizes
            a[1:, 1:] -= np.diag(rate * m)
            mats.append(a)
            shifts.append(np.concatenate([[gamma * np.sum(m / p * sizes * xb)], -rate * m * sizes * xb]))
        mats, shifts = np.array(mats), np.array(shifts)
        second = np.einsum("k,kij,kab->iajb", weights, mats, mats).reshape(n * n, n * n)
        if np.max(np.abs(np.linalg.eigvals(second))) >= 1:
            return None
        mu = np.linalg.solve(np.eye(n) - np.einsum("k,kij->ij", weights, mats), weights @ shifts)
        am = np.einsum("kij,j->ki", mats, mu)
        rest = np.einsum("k,ki,kj->ij", weights, am, shifts)
        rest = rest + rest.T + np.einsum("k,ki,kj->ij", weights, shifts, shifts)
        rest[0, 0] += 2 * gamma
        s = np.linalg.solve(np.eye(n * n) - second, rest.reshape(-1)).reshape(n, n)
        out_mean.append(mu[0])
        out_var.append(s[0, 0] - mu[0] ** 2)
    return np.array(out_mean), np.array(out_var)


@pytest.mark.slow
def test_s45_memory_with_its_default_rate_is_stable_and_has_the_exact_law_at_p_one_quarter():
    """Eq. S45's memory update at p = 1/4 on the heterogeneous Gaussian: with the old default rate
    alpha / p_i = 4 (alpha = 1 / (omega + 1) = 1) the memory error is multiplied by -3 on each active
    round and the chain has no stationary law (it diverged within 200 rounds); with the default
    alpha = p_i / (omega + 1), LSD++'s draws have the exact stationary mean and variance of its
    chain, and QLSD++'s (16 levels) its mean, with a variance no smaller than LSD++'s."""
    from fedmcmc.data.synthetic import heterogeneous_gaussian
    from fedmcmc.models import gaussian_mean

    data, p = heterogeneous_gaussian(num_clients=6, dim=3), 0.25
    model, n = gaussian_mean(3), data.total
    gamma, mu = 0.2 / n, h.xbar(data)
    assert s45_lsd_pp_law(data, gamma, p, 1 / p) is None  # the old default: no stationary law
    law = s45_lsd_pp_law(data, gamma, p, 1.0)
    np.testing.assert_allclose(law[0], mu, rtol=1e-9)
    part = participation.bernoulli(p, "inverse_probability")
    lsd = h.run(lsd_pp(model, gamma, None, part, memory_update="inverse_probability"), data, chains=1000,
                iterations=500, burn_in=200)
    h.check_gaussian(lsd, mu, law[1], "LSD++ S45 p = 1/4")
    # power: the law differs from ULA's by far more than the tolerance
    _, sq = h.chain_moments(lsd, mu)
    assert np.all(np.abs(law[1] - h.ula_variance(gamma, n)) > 2 * h.Z * sq.std(axis=0) / np.sqrt(sq.shape[0]))
    qlsd = h.run(qlsd_pp(model, gamma, None, quantization(16), part, memory_update="inverse_probability"), data,
                 chains=1000, iterations=500, burn_in=200)
    means, sq = h.chain_moments(qlsd, mu)
    h.assert_close(means, mu, "QLSD++ S45 p = 1/4 mean")
    m, se = sq.mean(axis=0), sq.std(axis=0, ddof=1) / np.sqrt(sq.shape[0])
    assert np.all(np.isfinite(qlsd)) and np.all(m >= law[1] - h.Z * se), (m, law[1])
