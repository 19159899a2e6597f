"""FA-HMC and FA-LD: the stochastic leapfrog integrator (two gradient draws per step), exact
reductions, the two clocks (T counts leapfrog steps or trajectories), and statistical tests
against the exact law of the discretised chain (:mod:`fedmcmc.evaluation.laws`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc import from_clients, simulate
from fedmcmc.samplers import participation
from fedmcmc.compression import quantization
from fedmcmc.data.synthetic import logistic_regression_data
from fedmcmc.evaluation.laws import fa_hmc_law, fa_hmc_radius
from fedmcmc.models import gaussian_factors, logistic_regression
from fedmcmc.samplers import fa_hmc, fa_ld
from fedmcmc.samplers.fa_hmc import FAUpload
from fedmcmc.samplers.integrators import leapfrog
from fedmcmc.samplers.trajectories import round_period, round_trajectories

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


@pytest.mark.slow
def test_fa_ld_is_fa_hmc_with_one_leapfrog_step():
    a = simulate(3, fa_ld(MODEL, W, ETA, T), DATA, jnp.zeros(DIM), 5, num_chains=2).samples
    b = simulate(3, fa_hmc(MODEL, W, ETA, 1, T), DATA, jnp.zeros(DIM), 5, num_chains=2).samples
    np.testing.assert_array_equal(a, b)


def halving(t):
    return jnp.where(t < 4, 0.2, 0.1)


@pytest.mark.parametrize("local_steps, schedule", [(1, None), (3, None), (3, halving)])
def test_one_client_with_shared_momentum_is_unadjusted_hmc(local_steps, schedule):
    """Trajectory clock (Algorithm 3), step for step, including a step-size schedule of the
    trajectory counter t = k T + s."""
    data, _ = logistic_regression_data(seed=1, dim=5, num_points=60, num_clients=1, feature_scale=0.5)
    model = logistic_regression(5)
    eta, k, rounds = 0.2, 6, 5
    sampler = fa_hmc(model, [1.0], schedule or eta, k, local_steps, correlation=1.0, clock="trajectory")
    samples = simulate(7, sampler, data, jnp.zeros(5), rounds).samples[0]

    x, y = data.unpadded(0)

    def grad(key, theta):  # the full potential, prior included
        return jax.grad(lambda t: jnp.sum(jax.nn.softplus(x @ t) - y * (x @ t)) + 0.5 * jnp.sum(t**2))(theta)

    # one compiled trajectory, the step size an argument (called eagerly, each call compiled anew)
    trajectory = jax.jit(lambda theta, p, step: leapfrog(grad, jax.random.PRNGKey(0), theta, p, grad(None, theta),
                                                         step, k)[0])
    chain = jax.random.fold_in(jax.random.PRNGKey(7), 0)
    theta = jnp.zeros(5)
    for r in range(rounds):
        seed = jax.random.fold_in(jax.random.fold_in(chain, r), 1)  # the server's key, broadcast
        for s in range(local_steps):
            xi = jax.random.normal(jax.random.fold_in(seed, s), (5,))
            step = eta if schedule is None else float(schedule(r * local_steps + s))
            theta = trajectory(theta, xi, step)
        np.testing.assert_allclose(samples[r], theta, rtol=2e-5, atol=2e-6)


def every_fifth_to_tenth(j):  # a schedule of the trajectory counter j = floor(n / K)
    return jnp.where(j < 2, 0.2, 0.1)


@pytest.mark.slow
@pytest.mark.parametrize("momentum_sync, schedule", [("local", None), ("local", every_fifth_to_tenth),
                                                     ("average", None)])
def test_one_client_on_the_leapfrog_clock_is_unadjusted_hmc(momentum_sync, schedule):
    """Leapfrog clock with K = 5 > T = 3: a round is 3 leapfrog steps, momenta are drawn at the
    global steps n = 0, 5, 10, 15 (mid-round), and a trajectory goes on across synchronisations
    with its momentum; with one client both momentum policies keep it. The schedule switches at
    the third trajectory (n = 10, inside round 3)."""
    data, _ = logistic_regression_data(seed=1, dim=5, num_points=60, num_clients=1, feature_scale=0.5)
    model = logistic_regression(5)
    eta, k, t, rounds = 0.2, 5, 3, 6
    sampler = fa_hmc(model, [1.0], schedule or eta, k, t, correlation=1.0, momentum_sync=momentum_sync)
    samples = simulate(7, sampler, data, jnp.zeros(5), rounds).samples[0]

    x, y = data.unpadded(0)

    def grad(key, theta):  # the full potential, prior included
        return jax.grad(lambda u: jnp.sum(jax.nn.softplus(x @ u) - y * (x @ u)) + 0.5 * jnp.sum(u**2))(theta)

    one_step = jax.jit(lambda theta, p, step: leapfrog(grad, jax.random.PRNGKey(0), theta, p, None, step, 1)[:2])
    chain = jax.random.fold_in(jax.random.PRNGKey(7), 0)
    theta, p = jnp.zeros(5), None
    for r in range(rounds):
        seed = jax.random.fold_in(jax.random.fold_in(chain, r), 1)  # the server's key, broadcast
        starts = [s for s in range(t) if (r * t + s) % k == 0]
        for s in range(t):
            n = r * t + s
            if s in starts:  # the j-th trajectory begun in this round draws xi from fold_in(seed, j)
                p = jax.random.normal(jax.random.fold_in(seed, starts.index(s)), (5,))
            step = eta if schedule is None else float(schedule(n // k))
            theta, p = one_step(theta, p, step)
        np.testing.assert_allclose(samples[r], theta, rtol=2e-5, atol=2e-6)


@pytest.mark.slow
def test_trajectory_clock_is_the_leapfrog_clock_with_k_t_steps():
    """Algorithm 3 with T trajectories per round is the leapfrog clock with K T steps: same draws."""
    kw = dict(correlation=0.5, gradient_noise=1.0, debiased=True)
    a = simulate(3, fa_hmc(MODEL, W, ETA, 4, 3, clock="trajectory", **kw), DATA, jnp.zeros(DIM), 4, num_chains=2)
    b = simulate(3, fa_hmc(MODEL, W, ETA, 4, 12, clock="leapfrog", **kw), DATA, jnp.zeros(DIM), 4, num_chains=2)
    np.testing.assert_array_equal(a.samples, b.samples)


@pytest.mark.parametrize("steps, k", [(3, 8), (8, 3), (5, 12), (12, 4), (7, 7), (1, 2), (6, 4)])
def test_round_trajectories_match_the_global_step_counter(steps, k):
    """Where trajectories start in round k, from the global step n = k S + t, without forming k S."""
    for r in list(range(3 * k)) + [2_000_000_000]:  # r S overflows int32 in the last one
        starts = [t for t in range(steps) if (r * steps + t) % k == 0]
        first, count, counter = round_trajectories(jnp.int32(r), steps, k)
        assert int(count) == len(starts)
        if starts:
            assert int(first) == starts[0]
        else:
            assert int(first) >= steps
        if r < 1_000_000:
            assert int(counter) == (r * steps) // k


def scalar_leapfrog_variance(eta, num_steps, sigma, two_draws):
    """Var(theta_K) for U = theta^2 / 2 from theta_0 = 0, p ~ N(0, 1), gradients theta + sigma e:
    coefficients of (p, e_1, e_2, ...) propagated step by step, independently of fedmcmc.evaluation.laws."""
    size = 1 + 2 * num_steps + 1
    theta, p = np.zeros(size), np.eye(size)[0]
    used = [0]

    def draw(theta):
        used[0] += 1
        return theta + sigma * np.eye(size)[used[0]]

    g = draw(theta)
    for _ in range(num_steps):
        if two_draws:
            g = draw(theta)  # the opening half-kick's own xi_k
        p = p - 0.5 * eta * g
        theta = theta + eta * p
        g = draw(theta)  # xi_{k+1/2}, reused by the next opening half-kick if not two_draws
        p = p - 0.5 * eta * g
    return float(theta @ theta)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gaussian noise", "minibatches of one"])
def test_two_gradient_draws_per_leapfrog_step(kind):
    """Issue 13's check: one client, U = theta^2 / 2, sigma = 2, eta = 0.5, K = 3, 40,000 chains.
    With a fresh gradient draw per half-kick (Algorithm 1) Var(theta_K) is the exact law's; one
    draw reused by the closing and the next opening half-kick would give a larger variance.
    Minibatches of one of two factors at -2 and 2 (curvature 1/2 each) have the same U and an
    additive gradient noise of variance 4: not Gaussian, but the same first two moments."""
    eta, k, sigma, chains = 0.5, 3, 2.0, 40_000
    two = scalar_leapfrog_variance(eta, k, sigma, True)
    reused = scalar_leapfrog_variance(eta, k, sigma, False)
    law = fa_hmc_law([1.0], [0.0], [1.0], eta, k, k, gradient_noise=sigma, rounds=1)
    np.testing.assert_allclose(law.var[1], two, rtol=1e-12)
    model = gaussian_factors(1)
    if kind == "gaussian noise":
        data = from_clients([(np.zeros((1, 1)), np.ones(1))])
        sampler = fa_hmc(model, [1.0], eta, k, k, gradient_noise=sigma)
    else:
        data = from_clients([(np.array([[-sigma], [sigma]]), np.full(2, 0.5))])
        sampler = fa_hmc(model, [1.0], eta, k, k, batch_size=1)
    x = simulate(5, sampler, data, jnp.zeros(1), 1, num_chains=chains).samples[:, 0, 0].astype(np.float64)
    h.assert_close(x, 0.0, f"{kind}: mean of theta_K")
    m, se = h.assert_close(x**2, law.var[1], f"{kind}: variance of theta_K")
    assert abs(m - reused) > h.Z * se, (m, se, reused)  # the reused draw's variance is rejected
    print(f"{kind}: variance {m:.4f} +- {se:.4f} vs exact {law.var[1]:.4f} (reused draw: {reused:.4f})")


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


ALG3 = dict(clock="trajectory")
CONFIGS = {
    # Algorithm 3 as printed: a round is T trajectories of K leapfrog steps
    "fa-hmc": dict(ALG3),
    "shared momentum, noisy gradients": dict(ALG3, correlation=0.5, gradient_noise=2.0),
    "fully shared momentum": dict(ALG3, correlation=1.0),
    "de-biased": dict(ALG3, debiased=True, gradient_noise=1.0),
    "fa-ld": dict(ALG3, k=1, t=5, eta=0.3),
    # a client's factors are identical, so (N_c / 1) x one factor is its exact gradient: the same law
    "minibatches of one": dict(ALG3, batch_size=1),
    # the paper's experiments: a round is T leapfrog steps, a trajectory K steps
    "leapfrog clock, K > T, K not a multiple of T": dict(k=8, t=3, correlation=0.5, gradient_noise=1.0),
    "leapfrog clock, K < T, K not dividing T": dict(k=3, t=8, correlation=0.5, gradient_noise=1.0),
    "leapfrog clock, K divides T": dict(k=4, t=8, gradient_noise=1.0),
    # private momenta (rho = 0) over trajectories of 12 steps synchronised every 5: the two
    # momentum policies' laws differ by up to hundreds of standard errors here
    "leapfrog clock, momenta kept": dict(eta=0.2, k=12, t=5, gradient_noise=1.0),
    "leapfrog clock, momenta averaged": dict(eta=0.2, k=12, t=5, gradient_noise=1.0, momentum_sync="average"),
    "leapfrog clock, de-biased (Alg. B.2)": dict(k=8, t=3, debiased=True, gradient_noise=1.0),
    "leapfrog clock, minibatches of one": dict(k=5, t=3, batch_size=1),
}


def build(**kw):
    kw = dict(kw)
    eta, k, t = kw.pop("eta", ETA), kw.pop("k", K), kw.pop("t", T)
    return fa_hmc(MODEL, W, eta, k, t, **kw)


def law_settings(kw):
    return {key: value for key, value in kw.items() if key != "batch_size"}


#: Both law tests run this many chains for this many rounds: one compiled program per config.
LAW_CHAINS, LAW_ROUNDS = 250, 160


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_transient_law_matches_the_exact_recursion(name):
    """From a fixed start, the law of the averaged theta after rounds 1, 2, 5 and 12."""
    samples = simulate(11, build(**CONFIGS[name]), DATA, jnp.full(DIM, 8.0), LAW_ROUNDS,
                       num_chains=LAW_CHAINS).samples
    law = exact_law(12, theta0=8.0, **law_settings(CONFIGS[name]))
    for r in (1, 2, 5, 12):
        x = samples[:, r - 1, :].reshape(-1).astype(np.float64)  # chains x coordinates: independent
        h.assert_close(x, law.mean[r], f"{name} mean, round {r}")
        h.assert_close((x - law.mean[r]) ** 2, law.var[r], f"{name} variance, round {r}")


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_stationary_law_matches_the_exact_recursion(name):
    """Per phase r mod P of the rounds done: where trajectories start in a round repeats every P
    rounds on the leapfrog clock, and so does the stationary law (P = 1 if K divides the steps)."""
    settings = law_settings(CONFIGS[name])
    law = exact_law(**settings)
    period = round_period(settings.get("k", K), settings.get("t", T), settings.get("clock", "leapfrog"))
    assert law.mean.shape == (period,)
    start = jnp.full(DIM, float(law.mean[0]), jnp.float32)
    res = simulate(12, build(**CONFIGS[name]), DATA, start, LAW_ROUNDS, num_chains=LAW_CHAINS, burn_in=40)
    phase = np.rint(res.draw_iterations).astype(int) % period
    for i in range(period):
        h.check_gaussian(res.samples[:, phase == i], np.full(DIM, law.mean[i]), law.var[i], f"{name}, phase {i}")


@pytest.mark.slow
@pytest.mark.parametrize("clock", ["trajectory", "leapfrog"])
def test_de_biasing_removes_the_heterogeneity_bias(clock):
    """In every phase of the stationary law (K = 8 > T = 3 on the leapfrog clock: 8 phases)."""
    posterior_mean = np.sum(W * LAM * MU) / np.sum(W * LAM)
    plain, debiased = exact_law(clock=clock), exact_law(debiased=True, clock=clock)
    np.testing.assert_allclose(debiased.mean, posterior_mean, rtol=1e-10)
    assert np.all(np.abs(plain.mean - posterior_mean) > 1e-4)  # a bias (0.026; 5e-4 to 7e-4) for it to remove
    # the exact recursion itself is checked against samples in the tests above


@pytest.mark.slow
def test_de_biasing_is_unstable_with_long_local_trajectories_on_heterogeneous_curvatures():
    """Over T = 400 leapfrog steps a client relaxes to the minimiser of its corrected potential,
    and the average of those overshoots by ``lam sum_c w_c / lam_c`` (2.2 here: client 2 is four
    times flatter than the mean): the mean map expands, there is no stationary law at any
    noise, and the sampler's spread grows as the exact recursion's. Without de-biasing, or with
    T = 3, the chain is stable (laws.fa_hmc_radius)."""
    assert fa_hmc_radius(LAM, W, ETA, K, 400, debiased=True) > 1.05
    assert fa_hmc_radius(LAM, W, ETA, K, T, debiased=True) < 1 and fa_hmc_radius(LAM, W, ETA, K, 400) < 1
    law = fa_hmc_law(LAM, MU, W, ETA, K, 400, debiased=True, rounds=20, theta0=8.0)
    assert law.var[20] > 30 * law.var[1]
    samples = simulate(3, build(t=400, debiased=True), DATA, jnp.full(DIM, 8.0), 20, num_chains=100).samples
    for r in (5, 20):
        x = samples[:, r - 1, :].reshape(-1).astype(np.float64)
        h.assert_close((x - law.mean[r]) ** 2, law.var[r], f"de-biased, T = 400: variance, round {r}")


@pytest.mark.slow
@pytest.mark.parametrize("clock", ["trajectory", "leapfrog"])
def test_compressed_uploads_and_partial_participation_stay_unbiased(clock):
    """One round from a fixed theta: E[theta_1] is unchanged by unbiased compression and by
    1/p participation; the spread grows."""
    law = exact_law(1, theta0=8.0, clock=clock)
    scheme = participation.bernoulli([0.9, 0.6, 0.7], "inverse_probability")
    sampler = fa_hmc(MODEL, W, ETA, K, T, compressor=quantization(4), participation=scheme, clock=clock)
    x = simulate(5, sampler, DATA, jnp.full(DIM, 8.0), 1, num_chains=400).samples[:, 0, :].reshape(-1)
    h.assert_close(x.astype(np.float64), law.mean[1], "compressed, partial participation mean")
    assert np.var(x) > 1.5 * law.var[1]


@pytest.mark.slow
def test_bits_on_the_wire():
    d = DIM
    plain = simulate(0, fa_hmc(MODEL, W, ETA, 2, 1), DATA, jnp.zeros(d), 3)
    debiased = simulate(0, fa_hmc(MODEL, W, ETA, 2, 1, debiased=True), DATA, jnp.zeros(d), 3)
    assert plain.total_bits_up[0] == 3 * 3 * 32 * d
    assert plain.total_bits_down[0] == 3 * 3 * (32 * d + 64)
    assert debiased.total_bits_up[0] == 3 * 3 * 64 * d
    assert debiased.total_bits_down[0] == 3 * 3 * (64 * d + 64)
    # momenta averaged across a synchronisation: one more raw vector each way (K = 2, T = 1) ...
    averaged = simulate(0, fa_hmc(MODEL, W, ETA, 2, 1, momentum_sync="average"), DATA, jnp.zeros(d), 3)
    assert averaged.total_bits_up[0] == 3 * 3 * 64 * d
    assert averaged.total_bits_down[0] == 3 * 3 * (64 * d + 64)
    # ... and nothing more when every round starts a trajectory (K = 2 divides T = 4)
    aligned = simulate(0, fa_hmc(MODEL, W, ETA, 2, 4, momentum_sync="average"), DATA, jnp.zeros(d), 3)
    assert aligned.total_bits_up[0] == plain.total_bits_up[0]
    assert aligned.total_bits_down[0] == plain.total_bits_down[0]


@pytest.mark.parametrize("kwargs, message", [
    (dict(weights=[0.5, 0.6, 0.1]), "sum to 1"),
    (dict(weights=[0.5, -0.5, 1.0]), "positive"),
    (dict(correlation=1.5), "correlation"),
    (dict(num_leapfrog=0), "num_leapfrog"),
    (dict(local_steps=2.5), "local_steps"),
    (dict(step_size=-1.0), "step_size"),
    (dict(gradient_noise=float("nan")), "gradient_noise"),
    (dict(clock="round"), "clock"),
    (dict(momentum_sync="reset"), "momentum_sync"),
])
def test_bad_settings_are_rejected(kwargs, message):
    settings = dict(weights=W, step_size=ETA, num_leapfrog=K, local_steps=T) | kwargs
    with pytest.raises(ValueError, match=message):
        fa_hmc(MODEL, **settings)


def test_weights_for_another_number_of_clients_are_rejected():
    with pytest.raises(ValueError, match="per-client settings"):
        simulate(0, fa_hmc(MODEL, [0.5, 0.5], ETA, K, T), DATA, jnp.zeros(DIM), 2)


@pytest.mark.slow
def test_a_diverging_step_size_is_reported():
    from fedmcmc import DivergenceError

    with pytest.raises(DivergenceError, match="lower the step size"):
        simulate(0, fa_hmc(MODEL, W, 3.0, 20, 5), DATA, jnp.zeros(DIM), 40, num_chains=2)
