"""VR-FALD*: FA-LD with control variates at the mode (Plassier, Moulines and Durmus 2023).

On the quadratic clients of ``test_fa_hmc`` (heterogeneous curvatures ``LAM`` and centres ``MU``)
client ``c``'s corrected gradient is ``lam_c (theta - theta_ref) + grad f(theta_ref)``: FA-LD's
on the local potential of curvature ``lam_c`` centred at ``theta_ref - grad f(theta_ref) / lam_c``
(the mode ``theta*`` itself when ``theta_ref = theta*``). Its exact law is therefore FA-LD's
(:func:`fedmcmc.evaluation.laws.fa_hmc_law` with ``K = 1``) with those centres, against which the
chain's transient and stationary laws are compared; and FA-LD's stationary mean is off the
posterior mean where VR-FALD*'s is not.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc import simulate
from fedmcmc.compression import quantization
from fedmcmc.estimators.gradients import ModeResult
from fedmcmc.evaluation.laws import fa_hmc_law
from fedmcmc.samplers import fa_ld, participation, vr_fald_star
from test_fa_hmc import DATA, DIM, LAM, MODEL, MU, W

POSTERIOR_MEAN = float(np.sum(W * LAM * MU) / np.sum(W * LAM))
ETA, T = 0.3, 5


def control_point(theta_ref: float = POSTERIOR_MEAN) -> ModeResult:
    """The control point ``theta_ref`` (every coordinate) with its exact ``sum_c grad U_c``
    (``U_c = w_c f^(c)``; the prior is flat): the mode when ``theta_ref`` is the posterior mean."""
    grad_sum = float(np.sum(W * LAM * (theta_ref - MU)))
    return ModeResult(np.full(DIM, theta_ref, np.float32), np.full(DIM, grad_sum, np.float32),
                      abs(grad_sum) * np.sqrt(DIM), 0, 0)


def corrected_centres(theta_ref: float = POSTERIOR_MEAN) -> np.ndarray:
    """The centres of the corrected local potentials: ``theta_ref - grad f(theta_ref) / lam_c``."""
    return theta_ref - np.sum(W * LAM * (theta_ref - MU)) / LAM


CONFIGS = {
    "exact gradients": dict(),
    "shared noise": dict(correlation=0.5),
    "many local steps": dict(t=20),
    # a client's factors are identical, so a minibatch's control variate is exact: the same law
    "minibatches of one": dict(batch_size=1),
    # off the mode, the constant sum_c grad U_c(theta_ref) keeps the averaged drift exact
    "control point off the mode": dict(theta_ref=POSTERIOR_MEAN + 0.7),
}


def build(**kw):
    kw = dict(kw)
    eta, t, ref = kw.pop("eta", ETA), kw.pop("t", T), kw.pop("theta_ref", POSTERIOR_MEAN)
    return vr_fald_star(MODEL, W, eta, control_point(ref), t, **kw)


def exact_law(rounds=None, **kw):
    return fa_hmc_law(LAM, corrected_centres(kw.get("theta_ref", POSTERIOR_MEAN)), W, kw.get("eta", ETA), 1,
                      kw.get("t", T), correlation=kw.get("correlation", 0.0), rounds=rounds,
                      theta0=kw.get("theta0", 0.0))


@pytest.mark.slow
def test_one_client_is_fa_ld():
    """With one client the corrected gradient is grad U itself, and the noise is drawn as FA-LD draws it."""
    from fedmcmc.data.synthetic import logistic_regression_data
    from fedmcmc.estimators.gradients import find_mode
    from fedmcmc.models import logistic_regression

    data, _ = logistic_regression_data(seed=1, dim=5, num_points=60, num_clients=1, feature_scale=0.5)
    model = logistic_regression(5)
    mode = find_mode(model, data)
    a = simulate(3, vr_fald_star(model, [1.0], 0.2, mode, 4, 0.5), data, jnp.zeros(5), 6, num_chains=2).samples
    b = simulate(3, fa_ld(model, [1.0], 0.2, 4, 0.5), data, jnp.zeros(5), 6, num_chains=2).samples
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_the_exact_law_is_centred_at_the_mode():
    """The corrected potentials are all centred at theta*: the stationary mean is the posterior's
    at every step and number of local steps; FA-LD's is not (the bias the control variates remove)."""
    np.testing.assert_allclose(corrected_centres(), POSTERIOR_MEAN, rtol=1e-12)
    for eta, t in ((0.3, 5), (0.3, 20), (0.1, 50)):
        law = exact_law(eta=eta, t=t)
        plain = fa_hmc_law(LAM, MU, W, eta, 1, t)
        np.testing.assert_allclose(law.mean, POSTERIOR_MEAN, rtol=1e-10)
        assert np.all(np.abs(plain.mean - POSTERIOR_MEAN) > 1e-3), plain.mean
        np.testing.assert_allclose(law.var, plain.var, rtol=1e-10)  # the same curvatures: the same spread


#: Both law tests run this many chains for this many rounds.
LAW_CHAINS, LAW_ROUNDS = 200, 120


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_transient_law_matches_the_exact_recursion(name):
    """From theta = 8, the law of the averaged theta after rounds 1, 2, 5 and 12."""
    samples = simulate(11, build(**CONFIGS[name]), DATA, jnp.full(DIM, 8.0), 12, num_chains=LAW_CHAINS).samples
    law = exact_law(12, theta0=8.0, **CONFIGS[name])
    for r in (1, 2, 5, 12):
        x = samples[:, r - 1, :].reshape(-1).astype(np.float64)  # chains x coordinates: independent
        h.assert_close(x, law.mean[r], f"{name} mean, round {r}")
        h.assert_close((x - law.mean[r]) ** 2, law.var[r], f"{name} variance, round {r}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_stationary_law_matches_the_exact_recursion(name):
    law = exact_law(**CONFIGS[name])
    start = jnp.full(DIM, float(law.mean[0]), jnp.float32)
    res = simulate(12, build(**CONFIGS[name]), DATA, start, LAW_ROUNDS, num_chains=LAW_CHAINS, burn_in=30)
    h.check_gaussian(res.samples, np.full(DIM, law.mean[0]), law.var[0], name)


@pytest.mark.slow
def test_fa_ld_is_biased_by_the_heterogeneity_and_vr_fald_star_is_not():
    """20 local steps of eta = 0.3: FA-LD's stationary mean is 0.034 (0.033 sd) below the
    posterior mean; the samples reject the posterior mean for FA-LD and accept it for VR-FALD*,
    and each matches its own exact law."""
    t = 20
    plain_law, law = fa_hmc_law(LAM, MU, W, ETA, 1, t), exact_law(t=t)
    assert abs(plain_law.mean[0] - POSTERIOR_MEAN) > 0.03
    start = jnp.full(DIM, POSTERIOR_MEAN, jnp.float32)
    kw = dict(num_chains=100, burn_in=10)
    plain = simulate(5, fa_ld(MODEL, W, ETA, t), DATA, start, 60, **kw).samples
    corrected = simulate(5, vr_fald_star(MODEL, W, ETA, control_point(), t), DATA, start, 60, **kw).samples
    # per-chain time averages over all coordinates: independent across chains
    plain_means = plain.astype(np.float64).mean(axis=(1, 2))
    means = corrected.astype(np.float64).mean(axis=(1, 2))
    h.assert_close(means, POSTERIOR_MEAN, "VR-FALD* stationary mean")
    h.assert_close(plain_means, plain_law.mean[0], "FA-LD stationary mean")
    m, se = plain_means.mean(), plain_means.std(ddof=1) / np.sqrt(plain_means.size)
    assert abs(m - POSTERIOR_MEAN) > h.Z * se, f"FA-LD's bias is not seen: {m} vs {POSTERIOR_MEAN} (s.e. {se})"
    assert law.var[0] == pytest.approx(plain_law.var[0], rel=1e-10)


@pytest.mark.slow
def test_compressed_uploads_and_partial_participation_stay_unbiased():
    """One round from a fixed theta: E[theta_1] is unchanged by unbiased compression and by
    1/p participation; the spread grows."""
    law = exact_law(1, theta0=8.0)
    scheme = participation.bernoulli([0.9, 0.6, 0.7], "inverse_probability")
    sampler = vr_fald_star(MODEL, W, ETA, control_point(), T, compressor=quantization(4), participation=scheme)
    x = simulate(5, sampler, DATA, jnp.full(DIM, 8.0), 1, num_chains=400).samples[:, 0, :].reshape(-1)
    h.assert_close(x.astype(np.float64), law.mean[1], "compressed, partial participation mean")
    assert np.var(x) > 1.5 * law.var[1]


def test_bits_on_the_wire():
    d = DIM
    plain = simulate(0, vr_fald_star(MODEL, W, ETA, control_point(), 2), DATA, jnp.zeros(d), 3)
    shared = simulate(0, vr_fald_star(MODEL, W, ETA, control_point(), 2, correlation=0.5), DATA, jnp.zeros(d), 3)
    assert plain.total_bits_up[0] == shared.total_bits_up[0] == 3 * 3 * 32 * d
    assert plain.total_bits_down[0] == 3 * 3 * 32 * d
    assert shared.total_bits_down[0] == 3 * 3 * (32 * d + 64)  # and the shared noise's seed


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights=[0.5, 0.6, 0.1]), "sum to 1"),
    (dict(correlation=1.5), "correlation"),
    (dict(local_steps=0), "local_steps"),
    (dict(step_size=-1.0), "step_size"),
    (dict(mode=np.zeros(DIM)), "ModeResult"),
    (dict(mode=ModeResult(np.zeros(3), np.zeros(3), 0.0, 0, 0)), "dimension"),
    (dict(mode=ModeResult(np.full(DIM, np.nan), np.zeros(DIM), 0.0, 0, 0)), "not finite"),
])
def test_bad_settings_are_rejected(kwargs, message):
    settings = dict(weights=W, step_size=ETA, mode=control_point(), local_steps=T) | kwargs
    with pytest.raises(ValueError, match=message) as error:
        vr_fald_star(MODEL, **settings)
    assert "\n" not in str(error.value)


def test_the_automatic_step_keeps_the_target_on_heterogeneous_clients():
    """At the rule's step the exact stationary sd is within ``STD_INFLATION`` of the posterior's,
    centred at the mode, for 1 to 30 local steps; minibatches shrink the step less than FA-LD's
    (the control variates' noise, not a plain minibatch's), and a measured noise is used."""
    from fedmcmc.samplers import steps

    lam = float(np.sum(W * LAM))  # the posterior's curvature
    for t in (1, 3, 10, 30):
        setting = steps.Setting(lam, lam, {"local_steps": t}, np.array([1, 2, 3]), DIM)
        eta, _ = steps.auto_step("vr-fald*", setting)
        law = exact_law(eta=eta, t=t)
        assert 1.0 < np.sqrt(law.var[0] * lam) <= 1 + steps.STD_INFLATION + 1e-9
        np.testing.assert_allclose(law.mean, POSTERIOR_MEAN, rtol=1e-10)
    counts = np.array([100, 200, 300])
    setting = steps.Setting(lam, lam, {"local_steps": 3, "batch_size": 10}, counts, DIM)
    full, _ = steps.auto_step("vr-fald*", setting._replace(args={"local_steps": 3}))
    batched, _ = steps.auto_step("vr-fald*", setting)
    plain, _ = steps.auto_step("fa-ld", setting)
    assert plain < batched < full
    measured, formula = steps.auto_step("vr-fald*", setting._replace(noise=0.0))
    assert measured == pytest.approx(full) and "measured" in formula


@pytest.mark.slow
def test_flower_runtime_gives_the_simulators_samples_with_full_batches(tmp_path):
    """The conformance tests run minibatches; with full batches the clients hold grad U_c(theta*)
    from their first round, and the Flower server and clients (without Flower) still give the
    simulator's samples bit for bit."""
    import functools

    from fedmcmc.app import config
    from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime

    text = ('[problem]\nname = "heterogeneous-gaussian"\nnum_clients = 3\ndim = 3\nmin_size = 10\nmax_size = 30\n'
            '[sampler]\nname = "vr-fald*"\nstep_size = 1e-3\nlocal_steps = 4\ncorrelation = 0.5\n'
            '[run]\nseed = 4\nnum_chains = 5\nnum_iterations = 4\nchunk_size = 2\n')
    build_text = functools.cache(config.from_text)
    cfg, built = build_text(text)
    ref = simulate(4, built.sampler, built.data, np.zeros(built.model.dim), 4, num_chains=5, chunk_size=2)
    server = ServerRuntime(text, tmp_path, build_text)
    res = server.run(LocalTransport(text, server.b, build_text))
    np.testing.assert_array_equal(res.samples, ref.samples)
    np.testing.assert_array_equal(res.total_bits_up, ref.total_bits_up)
