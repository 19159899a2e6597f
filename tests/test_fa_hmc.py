"""FA-HMC and FA-LD: the leapfrog integrator, exact reductions, and statistical tests against the
exact law of the discretised chain (:mod:`fedmcmc.laws`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc import from_clients, participation, simulate
from fedmcmc.compression import quantization
from fedmcmc.data.synthetic import logistic_regression_data
from fedmcmc.laws import fa_hmc_law
from fedmcmc.models import gaussian_factors, logistic_regression
from fedmcmc.samplers import fa_hmc, fa_ld
from fedmcmc.samplers.fa_hmc import FAUpload, leapfrog

# Three clients with unequal weights and heterogeneous local posteriors (curvature, centre):
# client c holds factors whose local potential f^(c) = U_c / w_c is (lam_c / 2)||theta - mu_c||^2.
LAM = np.array([1.0, 0.25, 2.0])
MU = np.array([4.0, -2.0, 1.0])
COUNTS = (1, 2, 3)
W = np.asarray(COUNTS, float) / sum(COUNTS)
DIM = 40


def factor_problem(dim=DIM):
    clients = []
    for lam, mu, n, w in zip(LAM, MU, COUNTS, W):
        # n factors sharing lam_c w_c / n each: U_c = (lam_c w_c / 2)||theta - mu_c||^2
        clients.append((np.full((n, dim), mu), np.full((n,), lam * w / n)))
    return from_clients(clients)


DATA = factor_problem()
MODEL = gaussian_factors(DIM)
ETA, K, T = 0.1, 8, 3


def quadratic_grad(lam):
    return lambda key, theta: lam * theta


def energy(lam, theta, p):
    return 0.5 * jnp.sum(lam * theta**2) + 0.5 * jnp.sum(p**2)


def test_leapfrog_energy_error_is_second_order():
    lam = jnp.array([1.0, 4.0, 9.0])
    grad = quadratic_grad(lam)
    theta, p = jnp.array([1.0, -0.5, 0.3]), jnp.array([0.2, 1.0, -0.7])
    errors = []
    for eta in (0.04, 0.02, 0.01):
        steps = int(round(1.0 / eta))  # the same trajectory length
        th, pp, _ = leapfrog(grad, jax.random.PRNGKey(0), theta, p, grad(None, theta), eta, steps)
        errors.append(abs(float(energy(lam, th, pp) - energy(lam, theta, p))))
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 3.5) & (ratios < 4.5)), (errors, ratios)


def test_leapfrog_is_reversible():
    lam = jnp.array([1.0, 4.0, 9.0])
    grad = quadratic_grad(lam)
    theta, p = jnp.array([1.0, -0.5, 0.3]), jnp.array([0.2, 1.0, -0.7])
    th, pp, g = leapfrog(grad, jax.random.PRNGKey(0), theta, p, grad(None, theta), 0.05, 37)
    back, pb, _ = leapfrog(grad, jax.random.PRNGKey(0), th, -pp, g, 0.05, 37)
    np.testing.assert_allclose(back, theta, atol=1e-5)
    np.testing.assert_allclose(-pb, p, atol=1e-5)


def test_one_leapfrog_step_is_the_fa_ld_update():
    lam = jnp.array([1.0, 4.0])
    grad = quadratic_grad(lam)
    theta, p, eta = jnp.array([1.0, -0.5]), jnp.array([0.3, 0.8]), 0.1
    th, _, _ = leapfrog(grad, jax.random.PRNGKey(0), theta, p, grad(None, theta), eta, 1)
    np.testing.assert_allclose(th, theta - 0.5 * eta**2 * lam * theta + eta * p, rtol=1e-6)
    # and the exact law agrees with the closed form of one-client Langevin with gamma = eta^2 / 2
    gamma = 0.5 * eta**2
    law = fa_hmc_law([4.0], [1.5], [1.0], eta, 1, 7)
    np.testing.assert_allclose(law.mean, [1.5])
    np.testing.assert_allclose(law.var, [1.0 / (4.0 * (1.0 - gamma * 4.0 / 2.0))], rtol=1e-10)


def test_fa_ld_is_fa_hmc_with_one_leapfrog_step():
    a = simulate(3, fa_ld(MODEL, W, ETA, T), DATA, jnp.zeros(DIM), 5, num_chains=2).samples
    b = simulate(3, fa_hmc(MODEL, W, ETA, 1, T), DATA, jnp.zeros(DIM), 5, num_chains=2).samples
    np.testing.assert_array_equal(a, b)


def halving(t):
    return jnp.where(t < 4, 0.2, 0.1)


@pytest.mark.parametrize("local_steps, schedule", [(1, None), (3, None), (3, halving)])
def test_one_client_with_shared_momentum_is_unadjusted_hmc(local_steps, schedule):
    """Step for step, including a step-size schedule of the global iteration t = k T + s."""
    data, _ = logistic_regression_data(seed=1, dim=5, num_points=60, num_clients=1, feature_scale=0.5)
    model = logistic_regression(5)
    eta, k, rounds = 0.2, 6, 5
    sampler = fa_hmc(model, [1.0], schedule or eta, k, local_steps, correlation=1.0)
    samples = simulate(7, sampler, data, jnp.zeros(5), rounds).samples[0]

    x, y = data.unpadded(0)

    def grad(key, theta):  # the full potential, prior included
        return jax.grad(lambda t: jnp.sum(jax.nn.softplus(x @ t) - y * (x @ t)) + 0.5 * jnp.sum(t**2))(theta)

    chain = jax.random.fold_in(jax.random.PRNGKey(7), 0)
    theta = jnp.zeros(5)
    for r in range(rounds):
        seed = jax.random.fold_in(jax.random.fold_in(chain, r), 1)  # the server's key, broadcast
        for s in range(local_steps):
            xi = jax.random.normal(jax.random.fold_in(seed, s), (5,))
            step = eta if schedule is None else float(schedule(r * local_steps + s))
            theta, _, _ = leapfrog(grad, jax.random.PRNGKey(0), theta, xi, grad(None, theta), step, k)
        np.testing.assert_allclose(samples[r], theta, rtol=2e-5, atol=2e-6)


def test_server_averages_changes_with_client_weights():
    sampler = fa_hmc(MODEL, W, ETA, K, T)
    state, _ = sampler.init(jax.random.PRNGKey(0), jnp.ones(DIM))
    deltas = jnp.asarray(np.random.default_rng(0).standard_normal((3, DIM)), jnp.float32)
    uploads = FAUpload(deltas)
    new, broadcast, info = sampler.server_step(jax.random.PRNGKey(2), state, uploads, jnp.ones(3, bool), 0)
    np.testing.assert_allclose(new.position, 1.0 + W @ np.asarray(deltas), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(DATA.weights, W)
    assert int(info.broadcast_bits) == 32 * DIM + 64


def exact_law(rounds=None, **kw):
    return fa_hmc_law(LAM, MU, W, kw.pop("eta", ETA), kw.pop("k", K), kw.pop("t", T), rounds=rounds, **kw)


CONFIGS = {
    "fa-hmc": dict(),
    "shared momentum, noisy gradients": dict(correlation=0.5, gradient_noise=2.0),
    "fully shared momentum": dict(correlation=1.0),
    "de-biased": dict(debiased=True, gradient_noise=1.0),
    "fa-ld": dict(k=1, t=5, eta=0.3),
    # a client's factors are identical, so (N_c / 1) x one factor is its exact gradient: the same law
    "minibatches of one": dict(batch_size=1),
}


def build(**kw):
    kw = dict(kw)
    eta, k, t = kw.pop("eta", ETA), kw.pop("k", K), kw.pop("t", T)
    return fa_hmc(MODEL, W, eta, k, t, **kw)


def law_settings(kw):
    return {key: value for key, value in kw.items() if key != "batch_size"}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_transient_law_matches_the_exact_recursion(name):
    """From a fixed start, the law of the averaged theta after rounds 1, 2, 5 and 12."""
    rounds = 12
    samples = simulate(11, build(**CONFIGS[name]), DATA, jnp.full(DIM, 8.0), rounds, num_chains=250).samples
    law = exact_law(rounds, theta0=8.0, **law_settings(CONFIGS[name]))
    for r in (1, 2, 5, 12):
        x = samples[:, r - 1, :].reshape(-1).astype(np.float64)  # chains x coordinates: independent
        h.assert_close(x, law.mean[r], f"{name} mean, round {r}")
        h.assert_close((x - law.mean[r]) ** 2, law.var[r], f"{name} variance, round {r}")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_stationary_law_matches_the_exact_recursion(name):
    law = exact_law(**law_settings(CONFIGS[name]))
    start = jnp.full(DIM, float(law.mean[0]), jnp.float32)
    samples = simulate(12, build(**CONFIGS[name]), DATA, start, 160, num_chains=100, burn_in=40).samples
    h.check_gaussian(samples, np.full(DIM, law.mean[0]), law.var[0], name)


def test_de_biasing_removes_the_heterogeneity_bias():
    posterior_mean = np.sum(W * LAM * MU) / np.sum(W * LAM)
    plain, debiased = exact_law(), exact_law(debiased=True)
    np.testing.assert_allclose(debiased.mean, [posterior_mean], rtol=1e-10)
    assert abs(plain.mean[0] - posterior_mean) > 0.02  # a bias (0.026 here) for it to remove
    # the exact recursion itself is checked against samples in the tests above


def test_compressed_uploads_and_partial_participation_stay_unbiased():
    """One round from a fixed theta: E[theta_1] is unchanged by unbiased compression and by
    1/p participation; the spread grows."""
    law = exact_law(1, theta0=8.0)
    scheme = participation.bernoulli([0.9, 0.6, 0.7], "inverse_probability")
    sampler = fa_hmc(MODEL, W, ETA, K, T, compressor=quantization(4), participation=scheme)
    x = simulate(5, sampler, DATA, jnp.full(DIM, 8.0), 1, num_chains=400).samples[:, 0, :].reshape(-1)
    h.assert_close(x.astype(np.float64), law.mean[1], "compressed, partial participation mean")
    assert np.var(x) > 1.5 * law.var[1]


def test_bits_on_the_wire():
    d = DIM
    plain = simulate(0, fa_hmc(MODEL, W, ETA, 2, 1), DATA, jnp.zeros(d), 3)
    debiased = simulate(0, fa_hmc(MODEL, W, ETA, 2, 1, debiased=True), DATA, jnp.zeros(d), 3)
    assert plain.total_bits_up[0] == 3 * 3 * 32 * d
    assert plain.total_bits_down[0] == 3 * 3 * (32 * d + 64)
    assert debiased.total_bits_up[0] == 3 * 3 * 64 * d
    assert debiased.total_bits_down[0] == 3 * 3 * (64 * d + 64)


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights=[0.5, 0.6, 0.1]), "sum to 1"),
    (dict(weights=[0.5, -0.5, 1.0]), "positive"),
    (dict(correlation=1.5), "correlation"),
    (dict(num_leapfrog=0), "num_leapfrog"),
    (dict(local_steps=2.5), "local_steps"),
    (dict(step_size=-1.0), "step_size"),
    (dict(gradient_noise=float("nan")), "gradient_noise"),
])
def test_bad_settings_are_rejected(kwargs, message):
    settings = dict(weights=W, step_size=ETA, num_leapfrog=K, local_steps=T) | kwargs
    with pytest.raises(ValueError, match=message):
        fa_hmc(MODEL, **settings)


def test_weights_for_another_number_of_clients_are_rejected():
    with pytest.raises(ValueError, match="per-client settings"):
        simulate(0, fa_hmc(MODEL, [0.5, 0.5], ETA, K, T), DATA, jnp.zeros(DIM), 2)


def test_a_diverging_step_size_is_reported():
    from fedmcmc import DivergenceError

    with pytest.raises(DivergenceError, match="lower the step size"):
        simulate(0, fa_hmc(MODEL, W, 3.0, 20, 5), DATA, jnp.zeros(DIM), 40, num_chains=2)
