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
