"""Exact reductions with the same keys, determinism, and resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation
from fedmcmc.runtime import simulator as simulate_mod
from fedmcmc.compression import identity, quantization
from fedmcmc.samplers import lsd_pp, lsd_star, qlsd_pp, qlsd_sharp, qlsd_star, sgld
from fedmcmc import DivergenceError, simulate

DATA = h.problem()
MODEL = h.model_for(DATA)
GAMMA = 0.5 / DATA.total
ITERS = 50


def ula_reference(seed, num_clients, theta0, iterations, chain=0):
    """Full-gradient ULA written out by hand, drawing its noise from the server's keys."""
    x = np.concatenate(h.client_arrays(DATA)).astype(np.float32)
    grad = jax.jit(lambda t: jnp.sum(t[None, :] - x, axis=0))
    chain_key = jax.random.fold_in(jax.random.PRNGKey(seed), chain)
    theta = jnp.asarray(theta0, jnp.float32)
    out = []
    for k in range(iterations):
        server_key = jax.random.fold_in(jax.random.fold_in(chain_key, k + 1), num_clients)
        z = jax.random.normal(server_key, theta.shape)
        theta = theta - GAMMA * grad(theta) + jnp.sqrt(2 * GAMMA) * z
        out.append(np.asarray(theta))
    return np.stack(out)


THETA0 = np.array([1.0, -2.0, 0.5], np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qlsd", "lsd*", "lsd++", "qlsd++ identity"])
def test_full_batch_identity_full_participation_is_ula_step_for_step(name):
    mode = gradients.find_mode(MODEL, DATA)
    sampler = {
        "qlsd": lambda: qlsd_sharp(MODEL, GAMMA, None, identity()),
        "lsd*": lambda: lsd_star(MODEL, GAMMA, mode, None),
        "lsd++": lambda: lsd_pp(MODEL, GAMMA, None, refresh_every=5),
        "qlsd++ identity": lambda: qlsd_pp(MODEL, GAMMA, None, identity(), refresh_every=5),
    }[name]()
    ours = simulate(3, sampler, DATA, THETA0, ITERS).samples[0]
    ref = ula_reference(3, DATA.num_clients, THETA0, ITERS)
    # the same keys, so the same noise; sums are ordered differently, hence float tolerance
    np.testing.assert_allclose(ours, ref, rtol=0, atol=2e-4)
    assert np.abs(ours - ref).max() < 1e-2 * np.abs(ref - THETA0).max()


@pytest.mark.slow
def test_one_client_qlsd_is_centralised_sgld_bit_for_bit():
    pooled = DATA.pooled()
    fed = simulate(5, qlsd_sharp(MODEL, GAMMA, 20, identity()), pooled, THETA0, ITERS, num_chains=3)
    central = simulate(5, sgld(MODEL, GAMMA, 20), pooled, THETA0, ITERS, num_chains=3)
    np.testing.assert_array_equal(fed.samples, central.samples)
    assert central.total_bits_up.sum() == 0 and fed.total_bits_up.min() > 0


@pytest.mark.slow
def test_same_seed_same_samples_different_seed_different_samples():
    sampler = qlsd_sharp(MODEL, GAMMA, [3, 4, 5, 6], quantization(8),
                         participation.bernoulli(0.5, "inverse_probability"))
    a = simulate(11, sampler, DATA, THETA0, 40, num_chains=4, thinning=2)
    b = simulate(11, sampler, DATA, THETA0, 40, num_chains=4, thinning=2, chunk_size=6)
    c = simulate(12, sampler, DATA, THETA0, 40, num_chains=4, thinning=2)
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.bits_up, b.bits_up)
    assert not np.array_equal(a.samples, c.samples)
    # chains are independent streams
    assert not np.array_equal(a.samples[0], a.samples[1])


@pytest.mark.slow
def test_step_size_schedules():
    constant = simulate(2, qlsd_sharp(MODEL, GAMMA, [3, 4, 5, 6]), DATA, THETA0, 30, num_chains=2)
    scheduled = simulate(2, qlsd_sharp(MODEL, lambda k: GAMMA + 0.0 * k, [3, 4, 5, 6]), DATA, THETA0, 30, num_chains=2)
    np.testing.assert_array_equal(constant.samples, scheduled.samples)
    # a schedule that is zero after round 10 freezes the chain there (noise scales with sqrt(gamma))
    frozen = simulate(2, qlsd_sharp(MODEL, lambda k: jnp.where(k < 10, GAMMA, 0.0), [3, 4, 5, 6]), DATA, THETA0, 30)
    np.testing.assert_array_equal(frozen.samples[0, 10:], np.broadcast_to(frozen.samples[0, 9], (20, 3)))
    assert not np.array_equal(frozen.samples[0, 8], frozen.samples[0, 9])


@pytest.mark.slow
def test_per_client_compressors():
    """Heterogeneous constraints (QLSD supplement S1): each client quantises with its own s,
    and QLSD++ uses each client's own memory rate 1 / (omega_i + 1)."""
    levels = [1, 4, 16, 2**16]
    q = quantization(levels)
    assert np.allclose(1 / (q.omega(MODEL.dim) + 1), 1 / (np.minimum(3 / np.square(levels), np.sqrt(3) / np.asarray(levels)) + 1))
    per_client = simulate(0, qlsd_pp(MODEL, GAMMA, None, q, refresh_every=5), DATA, THETA0, 20, num_chains=2)
    assert np.all(np.isfinite(per_client.samples))
    # bits add up over clients: more levels cost more than the 1-level quantiser on everyone
    cheap = simulate(0, qlsd_pp(MODEL, GAMMA, None, quantization(1), refresh_every=5), DATA, THETA0, 20, num_chains=2)
    assert per_client.total_bits_up.min() > cheap.total_bits_up.max()


@pytest.mark.slow
def test_bits_are_the_clients_encoded_sizes():
    q = quantization(16)
    res = simulate(0, qlsd_sharp(MODEL, GAMMA, None, q), DATA, THETA0, 10, num_chains=2)
    assert np.all(res.active == DATA.num_clients)
    d = MODEL.dim
    # broadcast: 32 bits per coordinate to each active client
    np.testing.assert_array_equal(res.bits_down, 32 * d * DATA.num_clients)
    assert np.all(res.bits_up >= DATA.num_clients * 33)
    ident = simulate(0, qlsd_sharp(MODEL, GAMMA), DATA, THETA0, 10)
    np.testing.assert_array_equal(ident.bits_up, 32 * d * DATA.num_clients)


@pytest.mark.slow
def test_resume_after_a_crash_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    sampler = qlsd_star(MODEL, GAMMA, gradients.find_mode(MODEL, DATA), [3, 4, 5, 6], quantization(4))
    kwargs = dict(num_chains=3, burn_in=10, thinning=2, chunk_size=10, statistic=jnp.linalg.norm)
    full = simulate(7, sampler, DATA, THETA0, 60, **kwargs)

    real_save = simulate_mod.save_npz
    calls = {"n": 0}

    def crashing_save(path, **arrays):
        real_save(path, **arrays)
        calls["n"] += 1
        if calls["n"] == 5:  # chunk 0, state, chunk 1, state, chunk 2 written: die before its state
            raise KeyboardInterrupt

    monkeypatch.setattr(simulate_mod, "save_npz", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        simulate(7, sampler, DATA, THETA0, 60, out_dir=tmp_path, **kwargs)
    monkeypatch.setattr(simulate_mod, "save_npz", real_save)
    resumed = simulate(7, sampler, DATA, THETA0, 60, out_dir=tmp_path, resume=True, **kwargs)
    for field in ("samples", "bits_up", "bits_down", "active", "statistics", "total_bits_up"):
        np.testing.assert_array_equal(getattr(resumed, field), getattr(full, field), err_msg=field)
    with pytest.raises(ValueError, match="its run had seed = 7, this one 8"):
        simulate(8, sampler, DATA, THETA0, 60, out_dir=tmp_path, resume=True, **kwargs)


def test_divergence_is_reported_with_the_iteration():
    with pytest.raises(DivergenceError, match="lower the step size") as err:
        simulate(0, qlsd_sharp(MODEL, 3.0 / DATA.total), DATA, THETA0, 400, chunk_size=100)
    assert 0 < err.value.iteration <= 400


def test_empty_rounds_are_defined():
    """No division by zero: with p tiny, almost every round is empty."""
    for scaling in ("active", "inverse_probability"):
        sampler = qlsd_sharp(MODEL, GAMMA, participation=participation.bernoulli(1e-3, scaling))
        res = simulate(0, sampler, DATA, THETA0, 50)
        assert np.all(np.isfinite(res.samples))
        empty = res.active[0] == 0
        assert empty.sum() >= 45
        previous = np.concatenate([THETA0[None], res.samples[0, :-1]])
        still = np.all(res.samples[0] == previous, axis=-1)
        if scaling == "active":  # the chain waits
            assert np.all(still[empty])
        else:  # the (flat) prior and the noise still move it
            assert not np.any(still[empty])


def test_bad_settings_are_rejected_with_clear_messages():
    with pytest.raises(ValueError, match="step_size must be > 0"):
        qlsd_sharp(MODEL, 0.0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        participation.bernoulli(1.5)
    with pytest.raises(ValueError, match="batch_size"):
        qlsd_sharp(MODEL, GAMMA, 0)
    with pytest.raises(ValueError, match="multiple of thinning"):
        simulate(0, qlsd_sharp(MODEL, GAMMA), DATA, THETA0, 10, thinning=3)
    with pytest.raises(ValueError, match="per-client settings for 3 clients but the data has 4"):
        simulate(0, qlsd_sharp(MODEL, GAMMA, [2, 3, 4]), DATA, THETA0, 10)
    with pytest.raises(ValueError, match="different lengths"):
        qlsd_sharp(MODEL, GAMMA, [2, 3, 4, 5], quantization([4, 8]))
    with pytest.raises(ValueError, match="different lengths"):
        qlsd_pp(MODEL, GAMMA, None, identity(), participation.bernoulli([0.5, 0.5, 0.5]), memory_rate=[0.5, 0.5])
    with pytest.raises(ValueError, match="theta0"):
        simulate(0, qlsd_sharp(MODEL, GAMMA), DATA, np.zeros(7), 10)


@pytest.mark.slow
def test_sparse_execution_of_few_active_clients_equals_the_dense_path():
    """With ``max_active`` the simulator runs only the active clients: same keys, same samples,
    same client states (checked through stateful samplers) and the same bit counts. XLA may
    compile a vmap over 1 client and over 4 with different float contractions, so FA-HMC's
    leapfrog loop agrees to rounding (a given configuration is still bit-for-bit reproducible)."""
    from fedmcmc.samplers import participation as participation_lib
    from fedmcmc.compression import quantization
    from fedmcmc.models import gaussian_mean
    from fedmcmc.samplers import fa_hmc, qlsd_pp

    data = h.problem()
    model = gaussian_mean(3)
    cat = participation_lib.categorical([0.1, 0.2, 0.3, 0.4])
    dense = cat._replace(max_active=None)
    for build, rtol in ((lambda p: qlsd_pp(model, 1e-3, np.array([3, 4, 5, 6]), quantization(4), p, refresh_every=5), 0),
                        (lambda p: fa_hmc(model, data.weights, 0.01, 3, 2, debiased=True, compressor=identity(),
                                          participation=p), 1e-5)):
        a = simulate(0, build(cat), data, np.zeros(3), 40, num_chains=3)
        b = simulate(0, build(dense), data, np.zeros(3), 40, num_chains=3)
        np.testing.assert_allclose(a.samples, b.samples, rtol=rtol, atol=rtol)
        np.testing.assert_array_equal(a.bits_up, b.bits_up)
        assert a.active.sum() == 40 * 3


def test_categorical_participation_visits_shards_with_their_probabilities():
    import jax

    from fedmcmc.samplers import participation as participation_lib

    f = np.array([0.1, 0.2, 0.3, 0.4])
    cat = participation_lib.categorical(f)
    masks = np.asarray(jax.vmap(lambda k: cat.sample(k, 4))(jax.random.split(jax.random.PRNGKey(0), 20_000)))
    assert np.all(masks.sum(axis=1) == 1)
    freq = masks.mean(axis=0)
    assert np.all(np.abs(freq - f) < 5 * np.sqrt(f * (1 - f) / 20_000))
    for bad in ([0.5, 0.6], [1.0, 0.0], [[0.5, 0.5]]):
        with pytest.raises(ValueError, match="sum to 1"):
            participation_lib.categorical(bad)
