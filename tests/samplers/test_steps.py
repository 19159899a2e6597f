"""The step-size rules of step_size = "auto" (fedmcmc.samplers.steps)."""

import numpy as np
import pytest

from fedmcmc.compression import quantization
from fedmcmc.samplers import REGISTRY, steps
from fedmcmc.samplers.participation import bernoulli


def _setting(lam=50.0, counts=(40, 60, 100), **args):
    return steps.Setting(lam, None, args, np.asarray(counts), 8)


def test_every_registered_sampler_has_a_rule_or_says_why_not():
    assert all(callable(entry.step) for name, entry in REGISTRY.items() if name != "psgld")
    assert isinstance(REGISTRY["psgld"].step, str)


def test_ula_and_leapfrog_at_the_chosen_steps_inflate_the_stiffest_std_by_the_target():
    """ULA's stationary variance on N(0, 1 / lam) is 1 / (lam (1 - gamma lam / 2)); K leapfrog steps
    with fresh momenta give 1 / (lam (1 - eta^2 lam / 4)) for every K (computed from the map)."""
    lam = 50.0
    gamma, _ = steps.auto_step("lsd*", _setting(lam))
    assert (1 - gamma * lam / 2) ** -0.5 == pytest.approx(1 + steps.STD_INFLATION, rel=1e-3)
    eta, _ = steps.auto_step("fa-hmc", _setting(lam, weights=None, num_leapfrog=7, local_steps=1))
    kick, drift = np.array([[1, 0], [-eta / 2 * lam, 1]]), np.array([[1, eta], [0, 1]])
    (a, b), _ = np.linalg.matrix_power(kick @ drift @ kick, 7)
    assert (b * b / (1 - a * a) * lam) ** 0.5 == pytest.approx(1 + steps.STD_INFLATION, rel=1e-3)


def test_noise_compression_and_local_steps_shrink_the_step():
    base, _ = steps.auto_step("qlsd*", _setting())
    compressed, _ = steps.auto_step("qlsd*", _setting(compressor=quantization(4)))
    partial, _ = steps.auto_step("qlsd*", _setting(participation=bernoulli(0.5)))
    assert compressed < base and partial < base
    # QLSD#'s minibatch gradient of 20 of 200 points has 9 times the Hessian as covariance
    sharp, _ = steps.auto_step("qlsd#", _setting(batch_size=np.array([4, 6, 10])))
    assert sharp == pytest.approx(base / 10)
    one, _ = steps.auto_step("fa-ld", _setting(weights=None, local_steps=1))
    ten, _ = steps.auto_step("fa-ld", _setting(weights=None, local_steps=10))
    assert ten == pytest.approx(one / np.sqrt(10))
    visit, _ = steps.auto_step("cg-dsgld", _setting(probs=np.full(3, 1 / 3), local_steps=10))
    assert visit == pytest.approx(4 * steps.E / (50.0 * 1.5 * 10))  # the largest shard: w / f = 0.5 * 3


def test_per_client_steps_of_dg_sgld_and_the_learning_rate_of_fedavg():
    gamma, _ = steps.auto_step("dg-sgld", _setting(rho=np.array([0.1, 0.01, 0.01])))
    np.testing.assert_allclose(gamma, 2 * steps.E / (50.0 + 1 / np.array([0.1, 0.01, 0.01])))
    rate, _ = steps.auto_step("fedavg", _setting())
    assert rate == pytest.approx(200 / 50.0)


def test_dg_sgld_automatic_tolerance_smooths_a_gaussian_by_the_allowed_inflation():
    """rho = "auto": the theta-marginal of Gaussian factors of precisions H_i, each smoothed by rho,
    has precision sum_i H_i / (1 + rho H_i); with one factor carrying all of L its sd is wider by
    exactly 1 + STD_INFLATION, with the curvature spread over factors by less."""
    rho = steps.tolerance(50.0)
    assert np.sqrt(1 + rho * 50.0) == pytest.approx(1 + steps.STD_INFLATION)
    spread = np.array([10.0, 15.0, 25.0])
    assert np.sqrt(spread.sum() / np.sum(spread / (1 + rho * spread))) < 1 + steps.STD_INFLATION
    gamma, _ = steps.auto_step("dg-sgld", _setting(rho="auto"))
    assert gamma == pytest.approx(2 * steps.E / (50.0 + 1 / rho))


def test_psgld_and_a_bad_curvature_are_refused_in_one_line():
    with pytest.raises(ValueError, match="psgld has no step_size = \"auto\".*give step_size"):
        steps.auto_step("psgld", _setting())
    with pytest.raises(ValueError, match="positive and finite"):
        steps.auto_step("sgld", _setting(lam=float("nan")))


def test_the_clients_drift_and_the_shards_noise_shrink_the_step_when_they_bind():
    """FA-LD (K = 1, T = 10) keeps (beta / alpha) |b| below D in whitened units (L = m = 1); DSGLD
    keeps the shard noise's inflation gamma V lambda_max(S) / 2 below E; without heterogeneity
    the curvature rules stand; CG-DSGLD does not read it."""
    def whitened(**args):
        return steps.Setting(1.0, 1.0, args, np.asarray((40, 60, 100)), 8, drift=50.0, spread=600.0)

    plain, _ = steps.auto_step("fa-ld", _setting(lam=1.0, weights=None, local_steps=10))
    eta, rule = steps.auto_step("fa-ld", whitened(weights=None, local_steps=10))
    assert "drift" in rule and eta < plain
    assert eta**2 * (1 / 12 + 9 / 4) * 50.0 == pytest.approx(steps.MEAN_OFFSET)
    h, rule = steps.auto_step("dsgld", whitened(probs=np.full(3, 1 / 3), local_steps=10))
    assert "shard noise" in rule and h / 2 * 10 * 600.0 / 2 == pytest.approx(steps.E)
    cg = dict(probs=np.full(3, 1 / 3), local_steps=10, surrogate="a surrogate")
    assert steps.auto_step("cg-dsgld", whitened(**cg)) == steps.auto_step("cg-dsgld", _setting(lam=1.0, **cg))
    assert {name for name, entry in REGISTRY.items() if entry.shares} == {"fa-hmc", "fa-ld", "dsgld"}


def _lsd_star_stationary_cov(gamma, hessians, groups, batches, prior):
    """The exact stationary covariance of LSD*'s chain on a Gaussian posterior: ``delta' = delta -
    gamma G(delta) + sqrt(2 gamma) Z`` with ``G = prior delta + sum_i (N_i / n_i) sum_{j in B_i} H_j
    delta``, ``B_i`` drawn without replacement: ``Sigma = E[(I - gamma G) Sigma (I - gamma G)'] + 2
    gamma I``, whose fluctuation term is ``gamma^2 sum_i A_i sum_j D_j Sigma D_j``, ``D_j = H_j -
    mean_{k in i} H_k``."""
    d = prior.shape[0]
    h = prior + sum(hessians)
    m = np.eye(d) - gamma * h
    k = np.kron(m, m)
    for idx, n in zip(groups, batches):
        big = len(idx)
        mean = sum(hessians[j] for j in idx) / big
        k += gamma**2 * big * (big - n) / (n * (big - 1)) * sum(np.kron(hessians[j] - mean, hessians[j] - mean)
                                                                 for j in idx)
    return np.linalg.solve(np.eye(d * d) - k, 2 * gamma * np.eye(d).ravel()).reshape(d, d), h


def test_measured_minibatch_noise_keeps_lsd_star_within_the_target_and_the_papers_smoothness_does_not():
    """On a regression with a few high-leverage rows, the per-point smoothness ``M_bar = L / N``
    under-counts the control variates' minibatch noise: the exact law of LSD*'s chain at the rule's
    step is wider than the posterior by more than :data:`STD_INFLATION` in some direction, and
    within it with the noise measured by :func:`fedmcmc.estimators.curvature.minibatch_noise`."""
    import jax

    from fedmcmc.data import from_clients
    from fedmcmc.estimators.curvature import curvature, minibatch_noise
    from fedmcmc.models import linear_regression

    rng = np.random.default_rng(0)
    clients = []
    for n in (60, 90):
        x = rng.standard_normal((n, 3))
        x[:3] *= 6.0
        clients.append((x.astype(np.float32), rng.standard_normal(n).astype(np.float32)))
    data, model = from_clients(clients), linear_regression(3)
    hessians = [np.outer(r, r) for x, _ in clients for r in np.asarray(x, np.float64)]
    batches = np.array([6, 9])
    found = curvature(jax.random.key(0), model, data, np.zeros(3), tol=1e-7, smallest=True, max_rounds=300,
                      max_rounds_smallest=300)
    setting = steps.Setting(found.lambda_max, found.lambda_min, {"batch_size": batches}, data.counts, 3)
    cov = np.linalg.inv(np.eye(3) + sum(hessians))
    noise = minibatch_noise(jax.random.key(1), model, data, np.zeros(3), steps.noise_weights("lsd*", setting), cov,
                            max_rounds=300, tol=1e-7)

    def widest(s):  # the largest sd inflation over all directions: sqrt(lambda_max(H Sigma))
        gamma, _ = steps.auto_step("lsd*", s)
        cov, h = _lsd_star_stationary_cov(gamma, hessians, (range(60), range(60, 150)), batches, np.eye(3))
        return float(np.sqrt(np.max(np.linalg.eigvals(h @ cov).real)))

    assert widest(setting._replace(noise=noise.lambda_max)) <= 1 + steps.STD_INFLATION
    assert widest(setting) > 1 + 2 * steps.STD_INFLATION
    assert steps.noise_weights("lsd*", setting._replace(args={})) is None  # full batches: nothing to measure
    assert steps.noise_weights("fa-ld", setting) is None


@pytest.mark.slow
def test_dg_sgld_s_expected_ess_is_its_measured_ess():
    """DG-SGLD at its automatic step and tolerance on a Gaussian (every direction of curvature
    435), 4 chains of 18,000 rounds: the bulk ESS of every coordinate is the step record's
    ``expected_ess`` within 40% (a first-order estimate; the ESS's own Monte-Carlo error is ~10%),
    and the chains have not reached it if each client's partial move is ignored (``c_i = 1``)."""
    import tomllib

    from fedmcmc.app import config
    from fedmcmc.evaluation import diagnostics
    from fedmcmc.runtime.simulator import simulate

    text = ('[problem]\nname = "heterogeneous-gaussian"\nnum_clients = 4\ndim = 3\n[sampler]\nname = "dg-sgld"\n'
            'step_size = "auto"\nrho = "auto"\nnum_local_steps = 10\n[run]\nnum_chains = 4\nnum_iterations = 20000\n'
            "burn_in = 2000\nwhiten = false\n")
    built = config.build(tomllib.loads(text))
    res = simulate(0, built.sampler, built.data, np.zeros(3), 20_000, num_chains=4, burn_in=2_000)
    ess = diagnostics.ess(res.samples)
    assert ess.shape == (3,)
    np.testing.assert_allclose(ess, built.step["expected_ess"], rtol=0.4)
    exact_sweeps = 4 * 18_000 / (2 / (built.step["lambda_min"] * steps.tolerance(built.step["lambda_max"]) / 4))
    assert np.all(ess < exact_sweeps / 1.2)
