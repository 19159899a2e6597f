"""DSGLD and CG-DSGLD: estimator identities, exact stationary laws, surrogates, accounting.

Laws used (per coordinate, Gaussian model with prior N(0, tau^2 I), unit noise): a Langevin
chain ``theta <- theta + (h / 2)(-c theta + b + xi) + sqrt(h) Z`` with constant ``c`` and
zero-mean noise ``xi`` of variance ``s2`` has the stationary mean ``b / c`` and variance
``(h + (h / 2)^2 s2) / (1 - (1 - h c / 2)^2)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.estimators import gradients, surrogates
from fedmcmc.core.base import Model
from fedmcmc.data.federated import from_clients
from fedmcmc.data.synthetic import logistic_regression_data
from fedmcmc.models import gaussian_mean, linear_regression, logistic_regression
from fedmcmc.samplers import cg_dsgld, dsgld, sgld
from fedmcmc.estimators.conducive import conducive_gradient, conducive_term
from fedmcmc.samplers.dsgld import drift_estimate
from fedmcmc.runtime.simulator import simulate
from harness import Z, assert_close, check_gaussian

TAU2 = 5.0  # prior variance of the Gaussian-mean model (the authors' notebook)


def blobs(sizes=(30, 20, 40, 25, 35), dim=2, seed=0):
    rng = np.random.default_rng(seed)
    return from_clients([rng.uniform(-6, 6, dim) + rng.standard_normal((n, dim)) for n in sizes])


def stationary_var(h, c, s2=0.0):
    return (h + (h / 2) ** 2 * s2) / (1 - (1 - h * c / 2) ** 2)


def fitted_terms(fit, model, data, f, theta0):
    qs = [fit(jax.random.PRNGKey(i), model, data.client(i), theta0, f[i]) for i in range(data.num_clients)]
    q = surrogates.product(jax.tree_util.tree_map(lambda *a: jnp.stack(a), *qs))
    return [conducive_term(q, qs[i], f[i]) for i in range(data.num_clients)]


def full_gradient(model, data, theta):
    x = jax.tree_util.tree_map(lambda *a: jnp.asarray(np.concatenate(a)),
                               *[data.unpadded(i) for i in range(data.num_clients)])
    return jax.grad(lambda t: model.log_prior(t) + jnp.sum(jax.vmap(model.log_likelihood, (None, 0))(t, x)))(theta)


@pytest.mark.slow
@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_conducive_estimator_is_unbiased(alpha):
    """Lemma 1: E_s[v_s + alpha g_s] is the full gradient, here with inexact (diagonal Laplace)
    surrogates of a logistic regression, unequal shards, non-uniform f_s and minibatches."""
    full, _ = logistic_regression_data(seed=1, dim=3, num_points=120, num_clients=4, feature_scale=1.0)
    data = from_clients([jax.tree_util.tree_map(lambda a: a[: n], full.unpadded(i)) for i, n in enumerate((30, 12, 25, 7))])
    model = logistic_regression(3)
    f = np.array([0.4, 0.1, 0.3, 0.2], np.float32)
    theta = jnp.asarray([0.3, -0.5, 0.8])
    terms = fitted_terms(surrogates.laplace("diag"), model, data, f, jnp.zeros(3))
    oracle = gradients.minibatch_gradient(model, 4)
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())
    stacked = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *terms)

    def one(key):
        key_s, key_b = jax.random.split(key)
        s = jax.random.categorical(key_s, jnp.log(jnp.asarray(f)))
        cd = clients.take(s)
        term = jax.tree_util.tree_map(lambda a: a[s], stacked)
        def v_s(key, theta):
            return drift_estimate(key, model, oracle, theta, cd, jnp.asarray(f)[s])

        return conducive_gradient(v_s, term, alpha)(key_b, theta)

    draws = np.asarray(jax.jit(jax.vmap(one))(jax.random.split(jax.random.PRNGKey(0), 40_000)), np.float64)
    assert_close(draws, np.asarray(full_gradient(model, data, theta)), f"E[v_s + {alpha} g_s]")
    # the conducive term is not zero shard by shard, so the test has power
    assert np.max(np.abs(terms[1].offset)) > 1.0


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gaussian-mean", "linear-regression"])
def test_exact_surrogates_cancel_the_shard_bias(which):
    """With exact (Taylor) surrogates and full shards, v_s + g_s is the full gradient on every shard."""
    if which == "gaussian-mean":
        data, model = blobs(), gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    else:
        rng = np.random.default_rng(3)
        parts = []
        for n in (15, 30, 22):
            x = np.c_[np.ones(n), rng.normal(rng.normal(0, 2), 1, (n, 2))]
            parts.append((x, x @ np.array([1.0, -2.0, 0.5]) + rng.standard_normal(n)))
        data, model = from_clients(parts), linear_regression(3, noise_scale=1.0, prior_scale=2.0)
    d, b = model.dim, data.num_clients
    f = np.full(b, 1.0 / b, np.float32)
    terms = fitted_terms(surrogates.taylor("full"), model, data, f, jnp.zeros(d))
    laplace_terms = fitted_terms(surrogates.laplace("full", num_steps=3), model, data, f, jnp.zeros(d))
    oracle = gradients.minibatch_gradient(model, None)
    for theta in np.random.default_rng(1).normal(0, 3, (3, d)).astype(np.float32):
        exact = np.asarray(full_gradient(model, data, jnp.asarray(theta)))
        scale = np.max(np.abs(exact)) + 1.0
        for i in range(b):
            def v_s(key, theta, i=i):
                return drift_estimate(key, model, oracle, theta, data.client(i), f[i])

            for t in (terms[i], laplace_terms[i]):
                v = np.asarray(conducive_gradient(v_s, t, 1.0)(None, jnp.asarray(theta)))
                np.testing.assert_allclose(v, exact, atol=2e-4 * scale * b)
            biased = np.asarray(v_s(None, jnp.asarray(theta)))
            assert np.max(np.abs(biased - exact)) > 0.1 * scale  # DSGLD alone is off on each shard


@pytest.mark.slow
def test_dsgld_one_local_step_matches_sgld_in_law():
    """One point per shard, f_s = 1/N, one local step: DSGLD is SGLD with batch size 1. Both
    chains have the same exact stationary law (module docstring, xi = N (x_J - x_bar))."""
    rng = np.random.default_rng(0)
    n, d, h = 20, 2, 0.019
    x = rng.normal(1.0, 2.0, (n, d))
    data = from_clients([x[i: i + 1] for i in range(n)])
    model = gaussian_mean(d, prior_scale=1.0)
    c = n + 1.0
    mean, var = n * x.mean(axis=0) / c, stationary_var(h, c, n**2 * x.var(axis=0))
    ds = dsgld(model, np.full(n, 1.0 / n), h, 1)
    samples = simulate(0, ds, data, mean, 400, num_chains=500, burn_in=100).samples
    check_gaussian(samples, mean, var, "DSGLD, one step per visit")
    sg = sgld(model, h / 2, batch_size=1)
    samples = simulate(0, sg, data.pooled(), mean, 400, num_chains=500, burn_in=100).samples
    check_gaussian(samples, mean, var, "SGLD, batch size 1")


@pytest.mark.slow
def test_cg_dsgld_with_exact_surrogates_samples_the_langevin_law_of_the_posterior():
    """Exact surrogates, full shards: every local step is ULA on the posterior, whatever the
    visit length; the draws within a visit are recorded."""
    data = blobs()
    model = gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    n = data.total
    c = n + 1.0 / TAU2
    mean = np.concatenate([data.unpadded(i) for i in range(data.num_clients)]).sum(axis=0) / c
    h = 0.2 / c
    sampler = cg_dsgld(model, data.weights, h, 10, record_every=2)
    res = simulate(0, sampler, data, mean, 80, num_chains=400, burn_in=20)
    assert res.samples.shape == (400, 300, 2)
    check_gaussian(res.samples, mean, stationary_var(h, c), "CG-DSGLD, exact surrogates")


@pytest.mark.slow
def test_dsgld_long_visits_sample_the_shard_tempered_mixture():
    """The pathology, exactly: after a long visit to shard s the chain has forgotten where it
    came from and follows N(m_s, V_s), the Langevin law of p(theta) p(x_s | theta)^{1 / f_s}."""
    data = blobs()
    model = gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    b = data.num_clients
    f = np.full(b, 1.0 / b)
    h = 0.2 / (data.total + 1 / TAU2)
    c_s = np.asarray(data.counts) / f + 1.0 / TAU2
    assert np.max((1 - h * c_s / 2) ** 300) < 1e-6  # visits of 300 steps forget their start
    m_s = np.stack([data.unpadded(i).sum(axis=0) / f[i] for i in range(b)]) / c_s[:, None]
    v_s = stationary_var(h, c_s)[:, None]
    mix_mean = f @ m_s
    samples = simulate(0, dsgld(model, f, h, 300), data, mix_mean, 100, num_chains=200).samples
    flat = samples.reshape(-1, 2).astype(np.float64)  # independent draws
    se = flat.std(axis=0) / np.sqrt(flat.shape[0])
    assert np.all(np.abs(flat.mean(axis=0) - mix_mean) < Z * se)
    second = f @ (v_s + m_s**2)
    sq = flat**2
    assert np.all(np.abs(sq.mean(axis=0) - second) < Z * sq.std(axis=0) / np.sqrt(sq.shape[0]))
    posterior_sd = np.sqrt(1 / (data.total + 1 / TAU2))
    assert np.sqrt(np.max(f @ (m_s - mix_mean) ** 2)) > 20 * posterior_sd  # far from the posterior


def _correlated_gaussian(h):
    angle = 0.6
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    precision = rot @ np.diag([0.25, 4.0]) @ rot.T
    centre = np.array([1.5, -2.0])
    p32 = jnp.asarray(precision, jnp.float32)

    def log_likelihood(theta, m):
        r = theta - m
        return -0.5 * r @ p32 @ r

    model = Model(log_likelihood, lambda t: jnp.zeros((), t.dtype), 2, "correlated-gaussian")
    data = from_clients([centre[None]])
    # the Langevin chain's stationary covariance: (P - h P^2 / 4)^{-1}
    return model, data, centre, np.linalg.inv(precision - h * precision @ precision / 4)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_sgld_surrogate_recovers_a_known_gaussian(covariance):
    """Moments of local Langevin samples: the fitted mean and covariance (the inverse of the
    fitted precision: a precision, not a covariance, travels) match the chain's exact law."""
    h = 0.1
    model, data, centre, cov = _correlated_gaussian(h)
    fit = surrogates.sgld_moments(h, num_steps=40_000, burn_in=500, covariance=covariance)
    cd = data.client(0)
    fits = jax.jit(jax.vmap(lambda k: fit(k, model, cd, jnp.zeros(2), 1.0)))(jax.random.split(jax.random.PRNGKey(0), 16))
    means = np.stack([np.asarray(surrogates.GaussianSurrogate(p, s).mean()) for p, s in zip(fits.precision, fits.shift)])
    assert_close(means, centre, "fitted mean")
    if covariance == "full":
        covs = np.linalg.inv(np.asarray(fits.precision, np.float64)).reshape(16, 4)
        assert_close(covs, cov.ravel(), "fitted covariance")
    else:
        assert_close(1.0 / np.asarray(fits.precision, np.float64), np.diag(cov), "fitted variances")


@pytest.mark.slow
def test_laplace_surrogate_sits_at_the_local_mode():
    data, _ = logistic_regression_data(seed=2, dim=3, num_points=60, num_clients=2, feature_scale=1.0)
    model = logistic_regression(3)
    cd = data.client(0)
    q = surrogates.laplace("full")(None, model, cd, jnp.zeros(3), 0.5)
    log_density = surrogates.local_log_density(model, cd, 0.5)
    mode = q.mean()
    assert float(jnp.max(jnp.abs(jax.grad(log_density)(mode)))) < 1e-3
    np.testing.assert_allclose(q.precision, -jax.hessian(log_density)(mode), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_communication_and_draw_accounting():
    data = blobs()
    model = gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    b, d = data.num_clients, 2
    sampler = cg_dsgld(model, np.full(b, 1.0 / b), 1e-4, 20, batch_size=5, record_every=5)
    res = simulate(3, sampler, data, np.zeros(2), 12, num_chains=2, burn_in=2, thinning=2)
    m = 4
    assert res.draws_per_round == m and res.samples.shape == (2, 5 * m, d)
    np.testing.assert_allclose(res.draw_iterations[:m], [3.25, 3.5, 3.75, 4.0])
    per_surrogate = surrogates.surrogate_bits(d, "full")
    assert per_surrogate == 32 * (2 + 3)
    assert np.all(res.setup_bits_up == b * per_surrogate) and np.all(res.setup_bits_down == b * per_surrogate)
    assert np.all(res.total_bits_up == 12 * 32 * d * m + b * per_surrogate)
    assert np.all(res.total_bits_down == 12 * 32 * d + b * per_surrogate)
    assert res.bits_up.shape == res.samples.shape[:2] and res.bits_up[0, m - 1] == 2 * 32 * d * m
    assert np.all(res.active.reshape(2, 5, m)[..., :-1] == 0) and np.all(res.active.reshape(2, 5, m)[..., -1] == 2)
    # the last draw of a round is where the next visit starts
    again = simulate(3, sampler, data, np.zeros(2), 12, num_chains=2, burn_in=2, thinning=2)
    np.testing.assert_array_equal(res.samples, again.samples)


@pytest.mark.slow
def test_only_the_visited_shard_computes():
    """The simulator runs one shard a round (max_active = 1); the dense path gives the same draws."""
    data = blobs()
    model = gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    sparse = cg_dsgld(model, data.weights, 1e-3, 5, batch_size=4, surrogate=surrogates.taylor("diag"))
    assert sparse.participation.max_active == 1
    dense = sparse._replace(participation=sparse.participation._replace(max_active=None))
    a = simulate(0, sparse, data, np.zeros(2), 30, num_chains=3).samples
    b = simulate(0, dense, data, np.zeros(2), 30, num_chains=3).samples
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_bad_settings_are_rejected():
    model = gaussian_mean(2)
    with pytest.raises(ValueError, match="sum to 1"):
        dsgld(model, [0.5, 0.4], 1e-4, 10)
    with pytest.raises(ValueError, match="divisor"):
        dsgld(model, [0.5, 0.5], 1e-4, 10, record_every=3)
    with pytest.raises(ValueError, match="alpha"):
        cg_dsgld(model, [0.5, 0.5], 1e-4, 10, alpha=0.0)
    with pytest.raises(ValueError, match="covariance"):
        surrogates.taylor("banded")
    with pytest.raises(ValueError, match="step_size"):
        dsgld(model, [0.5, 0.5], -1.0, 10)
    with pytest.raises(ValueError, match="per-client"):
        simulate(0, dsgld(model, [0.5, 0.5], 1e-4, 2), blobs(), np.zeros(2), 2)


@pytest.mark.slow
def test_taylor_surrogates_at_the_anchor_make_every_shards_potential_the_posteriors_and_at_a_start_concave():
    """A shard's local potential in CG-DSGLD, ``-log p - (1 / f_s) log p(x_s | theta) - log q + (1 / f_s)
    log q_s``, has the Hessian ``H_0 + H_s / f_s + L - L_s / f_s`` at the mode. Taylor surrogates fitted
    at the mode (the anchor) make it the posterior's ``H`` on every shard; fitted at a start two
    posterior sds away, the conducive term repels (a negative eigenvalue) and stiffens another shard."""
    import jax
    import jax.numpy as jnp

    from catalog import breast_cancer
    from fedmcmc.estimators import surrogates
    from fedmcmc.estimators.approximation import laplace_approximation
    from fedmcmc.estimators.conducive import conducive
    from fedmcmc.estimators.gradients import find_mode

    data, model = breast_cancer(num_clients=3)
    mode = find_mode(model, data)
    approx = laplace_approximation(model, data, mode)
    f = np.asarray(data.weights)
    start = jnp.asarray(mode.theta + 2 * approx.sd * np.sign(np.random.default_rng(0).standard_normal(model.dim)),
                        jnp.float32)
    prior = -np.asarray(jax.hessian(model.log_prior)(mode.theta), np.float64)
    shards = [-np.asarray(jax.hessian(surrogates.local_log_density(model, data.client(s), 0.0))(mode.theta),
                          np.float64) for s in range(data.num_clients)]

    def local_hessians(cg):
        precisions = []
        for s in range(data.num_clients):
            state = cg.init(jax.random.key(0), model, data.client(s), start, jnp.float32(f[s]))
            state, _, _ = cg.upload(jax.random.key(0), model, state, data.client(s), start)
            precisions.append(np.asarray(state.surrogate.precision, np.float64))
        return [prior + h / f_s + sum(precisions) - p / f_s for h, f_s, p in zip(shards, f, precisions)]

    exact = np.linalg.inv(approx.cov)
    for a in local_hessians(conducive(anchor=mode.theta)):
        np.testing.assert_allclose(a, exact, rtol=1e-3, atol=1e-3 * np.abs(exact).max())
    loose = [np.linalg.eigvalsh(a) for a in local_hessians(conducive())]
    assert min(e[0] for e in loose) < -1.0 and max(e[-1] for e in loose) > 1.5 * np.linalg.eigvalsh(exact)[-1]


def _scaled_surrogates(k):
    """A fitter of diagonal Gaussian surrogates with precision ``k N_s`` per coordinate (``k`` one
    value per coordinate): the shard's likelihood curvature times ``k``, exact for ``k = 1``."""
    k = jnp.asarray(k, jnp.float32)

    def fit(key, model, client_data, theta0, share):
        precision = k * client_data.count.astype(jnp.float32)
        return surrogates.GaussianSurrogate(precision, precision * theta0)

    return fit


@pytest.mark.slow
def test_a_diverging_sgld_surrogate_is_refused_naming_its_fitter_and_a_good_one_runs():
    """A surrogate whose local Langevin chain diverges (step 10 on shards of curvature ~30) is not
    finite: refused after the setup exchange, naming the shard, the fitter and its remedy (a smaller
    surrogate_step_size or more surrogate_steps), not the sampler's step. A good fit runs, and the
    automatic step's own fit (visit_curvature) refuses the bad one in the same words."""
    from fedmcmc.estimators.conducive import conducive, visit_curvature

    data, model = blobs(), gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    f = np.asarray(data.weights)
    bad = surrogates.sgld_moments(10.0, num_steps=50, burn_in=10)
    pattern = (r"shard \d's Gaussian surrogate is not finite .*surrogate = \"sgld\".*surrogate_step_size = 10.*"
               r"smaller surrogate_step_size .* more surrogate_steps.*step_size is not the cause")
    with pytest.raises(ValueError, match=pattern) as err:
        simulate(0, cg_dsgld(model, f, 1e-3, 2, bad), data, np.zeros(2), 3)
    assert "\n" not in str(err.value) and "lower the step" not in str(err.value)
    with pytest.raises(ValueError, match=pattern):
        visit_curvature(jax.random.key(0), model, data, np.zeros(2), f, conducive(bad))
    good = surrogates.sgld_moments(1e-3, num_steps=200, burn_in=50)
    res = simulate(0, cg_dsgld(model, f, 1e-3, 2, good), data, np.zeros(2), 3)
    assert np.all(np.isfinite(res.samples))


@pytest.mark.parametrize("full_dim", [None, 0])  # dense eigenvalues, then power iterations
def test_the_visit_curvature_includes_the_conducive_term_in_closed_form(full_dim):
    """Gaussian shards: H_0 = I / tau^2, H_s = N_s I. With diagonal surrogates of precision k_j N_s
    (coordinate j), a visit's Hessian is M_s = H_0 + N_s / f_s + alpha k_j (N - N_s / f_s) per coordinate;
    Taylor surrogates (k = 1) give the posterior's H = H_0 + N on every shard."""
    from fedmcmc.estimators.conducive import conducive, visit_curvature

    data, model = blobs(), gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    sizes, f, alpha = np.asarray(data.counts, float), np.full(5, 0.2), 0.8
    n = sizes.sum()
    k = np.array([0.5, 0.7])
    got = visit_curvature(jax.random.key(0), model, data, np.zeros(2), f, conducive(_scaled_surrogates(k), alpha),
                          full_dim=full_dim)
    exact = 1 / TAU2 + sizes[:, None] / f[:, None] + alpha * k * (n - sizes[:, None] / f[:, None])  # [S, 2]
    rtol = 1e-4 if full_dim is None else 1e-3  # power iterations stop at a relative change of 1e-6
    np.testing.assert_allclose(got.top, exact.max(axis=1), rtol=rtol)
    np.testing.assert_allclose(got.low, exact.min(axis=1), rtol=rtol)
    taylor = visit_curvature(jax.random.key(0), model, data, np.zeros(2), f, conducive(surrogates.taylor("full")),
                             full_dim=full_dim)
    np.testing.assert_allclose(taylor.top, 1 / TAU2 + n, rtol=1e-4)
    np.testing.assert_allclose(taylor.low, 1 / TAU2 + n, rtol=1e-3)


@pytest.mark.slow
def test_the_automatic_step_reads_the_conducive_curvature_and_refuses_an_indefinite_visit():
    """CG-DSGLD's step_size = "auto" on the Gaussian shards: with Taylor surrogates at the mode it is
    DSGLD's rule (4E / (L max_s(w_s / f_s + kappa_s) V), here with full shards, kappa = 0); with
    over-confident surrogates at uniform f (k = 3: M_s = H_0 + 3 N - 2 N_s / f_s) the smallest shard's
    M_s exceeds every shard's own curvature L w_s / f_s and binds; at k = 5 (M_s = H_0 + 5 N - 4 N_s / f_s,
    -49.8 for the largest shard) the step still bounds the largest M_s (the shard's own bound, at least
    L, covers a negative eigenvalue down to -L); at k = 8 (-199.8, beyond -L = -150.2) the step is
    refused in one line naming the surrogates."""
    from fedmcmc.app import auto_step
    from fedmcmc.estimators.gradients import find_mode
    from fedmcmc.samplers import steps

    data, model = blobs(), gaussian_mean(2, prior_scale=np.sqrt(TAU2))
    sizes = np.asarray(data.counts, float)
    n, lam, visit = sizes.sum(), sizes.sum() + 1 / TAU2, 3
    mode = find_mode(model, data)
    for f in (np.asarray(data.weights), np.full(5, 0.2)):
        args = dict(model=model, probs=f, local_steps=visit, surrogate=surrogates.taylor("full"))
        value, record, _ = auto_step.auto_step(0, "cg-dsgld", args, model, data, mode)
        assert value == pytest.approx(4 * steps.E / (lam * np.max(sizes / n / f) * visit), rel=1e-4)
        assert record["visit_curvature"] == pytest.approx(lam, rel=1e-4)
    f = np.full(5, 0.2)
    args = dict(model=model, probs=f, local_steps=visit, surrogate=_scaled_surrogates([3.0, 3.0]))
    value, record, _ = auto_step.auto_step(0, "cg-dsgld", args, model, data, mode)
    top = np.max(1 / TAU2 + sizes / f + 3 * (n - sizes / f))
    assert top > 1.2 * lam * np.max(sizes / n / f)  # the conducive term binds
    assert value == pytest.approx(4 * steps.E / (top * visit), rel=1e-4) and "conducive" in record["rule"]
    args["surrogate"] = _scaled_surrogates([5.0, 5.0])
    value, record, _ = auto_step.auto_step(0, "cg-dsgld", args, model, data, mode)
    curvatures = 1 / TAU2 + sizes / f + 5 * (n - sizes / f)
    assert -lam < curvatures.min() < 0
    assert value == pytest.approx(4 * steps.E / (curvatures.max() * visit), rel=1e-4)
    given = steps.Setting(lam, None, dict(probs=f, local_steps=visit), data.counts, 2,
                          visit=(np.full(5, 100.0), np.array([50.0, -0.99 * lam, 10.0, 50.0, 50.0])))
    assert steps.auto_step("cg-dsgld", given)[0] == pytest.approx(4 * steps.E / (200.0 / 150 * lam * visit))
    with pytest.raises(ValueError, match="shard 1 is not convex"):
        steps.auto_step("cg-dsgld", given._replace(visit=(given.visit[0], given.visit[1] * 1.02)))
    args["surrogate"] = _scaled_surrogates([8.0, 8.0])
    assert np.argmin(1 / TAU2 + sizes / f + 8 * (n - sizes / f)) == 2 and np.min(1 / TAU2 + 8 * n - 7 * sizes / f) < -lam
    with pytest.raises(ValueError, match=r"visit potential on shard 2 is not convex at the mode.*eigenvalue -200.*"
                                         r"a custom surrogate fitter.*no step fixes that.*smaller alpha") as err:
        auto_step.auto_step(0, "cg-dsgld", args, model, data, mode)
    assert "\n" not in str(err.value)
