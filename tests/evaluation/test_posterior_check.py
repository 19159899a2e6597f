"""The Laplace approximation at the federated mode (exact on a conjugate Gaussian posterior) and
the posterior check against it: exact draws pass, too wide, too narrow and off-centre ones are
flagged, over several seeds."""

import jax
import numpy as np
import pytest

from fedmcmc.data.synthetic import heterogeneous_gaussian
from fedmcmc.estimators.approximation import Laplace, dispersed_starts, laplace_approximation
from fedmcmc.estimators.gradients import find_mode
from fedmcmc.evaluation.posterior_check import check
from fedmcmc.models import linear_regression
from fedmcmc.models.linear import linear_regression_posterior


def _regression(seed=0, n=300, d=4):
    from fedmcmc.data.federated import from_clients

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32) * np.array([1.0, 3.0, 0.3, 1.0], np.float32)[:d]
    x[:, -1] = x[:, 0] + 0.3 * x[:, -1]  # correlated coordinates: the full covariance matters
    y = (x @ rng.normal(size=d) + rng.normal(size=n)).astype(np.float32)
    return from_clients([(x[i::3], y[i::3]) for i in range(3)])


@pytest.mark.parametrize("full_dim", [200, 1])
def test_laplace_approximation_is_the_exact_posterior_of_a_conjugate_model(full_dim):
    data = _regression()
    model = linear_regression(4, noise_scale=1.0, prior_scale=2.0)
    exact = linear_regression_posterior(data, 1.0, 2.0)
    approx = laplace_approximation(model, data, find_mode(model, data, tol=1e-7), full_dim=full_dim)
    np.testing.assert_allclose(approx.mean, exact.mean, atol=2e-3 * np.sqrt(np.diag(exact.cov)).max())
    if full_dim == 200:
        assert approx.full and approx.bits == 3 * 32 * (4 + 10)
        np.testing.assert_allclose(approx.cov, exact.cov, rtol=1e-3, atol=1e-7)
        np.testing.assert_allclose(approx.sd, np.sqrt(np.diag(exact.cov)), rtol=1e-3)
    else:  # diagonal: the conditional sds, 1 / sqrt(H_ii)
        assert not approx.full and approx.bits == 3 * 32 * (4 + 4)
        np.testing.assert_allclose(approx.sd, 1 / np.sqrt(np.diag(np.linalg.inv(exact.cov))), rtol=1e-3)


def _gaussian(d=5):
    rng = np.random.default_rng(1)
    a = rng.normal(size=(d, d))
    cov = a @ a.T / d + 0.5 * np.eye(d)
    return Laplace(rng.normal(size=d), np.sqrt(np.diag(cov)), cov, True, 1, 0)


def _draws(seed, approx, scale=1.0, shift=0.0, chains=4, draws=500):
    z = np.random.default_rng(seed).normal(size=(chains, draws, approx.mean.size)) @ np.linalg.cholesky(approx.cov).T
    return approx.mean + shift * approx.sd + scale * z


@pytest.mark.parametrize("seed", range(5))
def test_exact_draws_pass_and_wrong_laws_are_flagged(seed):
    approx = _gaussian()
    assert check(_draws(seed, approx), approx)["passed"]
    wide = check(_draws(seed, approx, scale=2.0), approx)
    assert not wide["passed"] and all("too wide" in p["problems"] for p in wide["parameters"].values())
    narrow = check(_draws(seed, approx, scale=0.5), approx)
    assert not narrow["passed"] and all("too narrow" in p["problems"] for p in narrow["parameters"].values())
    off = check(_draws(seed, approx, shift=2.0), approx, names=list("abcde"))
    assert not off["passed"] and off["flagged"][0] in "abcde" and "Laplace sds from the mode" in off["worst"]
    assert all(p["problems"] == ["off-centre"] for p in off["parameters"].values())


def _ar1(seed, approx, rho, shift, chains=4, draws=2000):
    """Stationary AR(1) chains of the approximation's law (one coordinate), moved by ``shift`` sds."""
    rng = np.random.default_rng(seed)
    z = np.empty((chains, draws))
    z[:, 0] = rng.normal(size=chains)
    for t in range(1, draws):
        z[:, t] = rho * z[:, t - 1] + np.sqrt(1 - rho**2) * rng.normal(size=chains)
    return (approx.mean + approx.sd * (shift + z))[..., None]


def test_few_effective_draws_widen_the_allowance():
    """Chains of autocorrelation 0.98 (ESS about 80): the Monte-Carlo error of their mean is
    0.11 sds, so a shift of 1.2 sds is within the allowance 1 + 4 / sqrt(80); the same shift
    with nearly independent draws (ESS about 8,000) is not."""
    approx = _gaussian(1)
    slow = check(_ar1(0, approx, 0.98, 1.2), approx)
    assert slow["passed"] is True and slow["max_r_hat"] <= 1.05
    assert check(_ar1(0, approx, 0.0, 1.2), approx)["passed"] is False


def test_chains_that_have_not_mixed_make_the_check_inconclusive():
    approx = _gaussian(1)
    apart = _ar1(0, approx, 0.999, 0.0, draws=200) + np.arange(4)[:, None, None] * approx.sd  # each chain elsewhere
    report = check(apart, approx)
    assert report["passed"] is None and "have not mixed" in report["why"]


def test_diagonal_approximation_checks_too_narrow_only():
    approx = _gaussian()
    diagonal = approx._replace(sd=approx.sd / 2, cov=None, full=False)  # conditional sds are smaller
    assert check(_draws(0, approx), diagonal)["passed"]
    assert not check(_draws(0, approx, scale=0.2), diagonal)["passed"]


def test_dispersed_starts_are_over_dispersed_draws_of_the_approximation():
    data = heterogeneous_gaussian(num_clients=4, dim=3, seed=0)
    from fedmcmc.models import gaussian_mean

    model = gaussian_mean(dim=3)
    approx = laplace_approximation(model, data, find_mode(model, data))
    starts = dispersed_starts(jax.random.key(0), approx, 4000)
    assert starts.shape == (4000, 3) and starts.dtype == np.float32
    np.testing.assert_allclose(starts.std(axis=0) / approx.sd, 2.0, rtol=0.08)  # 4,000 draws: 1.1% error
    np.testing.assert_array_equal(starts, dispersed_starts(jax.random.key(0), approx, 4000))


def test_run_init_chooses_the_chains_starting_points():
    from fedmcmc.app import config, posterior

    text = ('[problem]\nname = "heterogeneous-gaussian"\nnum_clients = 4\ndim = 3\n[sampler]\nname = "lsd*"\n'
            'step_size = 1e-3\n[run]\nseed = 0\nnum_chains = 3\nnum_iterations = 10\n')
    cfg, built = config.from_text(text)
    started = config.with_start(cfg, built)
    approx, record = started.laplace
    assert record["available"] and record["rounds"] == 1  # lsd* found the mode: one more round
    assert started.start.shape == (3, 3) and len({tuple(row) for row in started.start}) == 3  # dispersed
    with_init = lambda init, **more: {**cfg, **more, "run": {**cfg["run"], "init": init}}  # noqa: E731
    np.testing.assert_array_equal(posterior.starts(with_init("mode"), 3, approx), np.tile(approx.mean, (3, 1)))
    np.testing.assert_array_equal(posterior.starts(with_init("zeros"), 3, approx), np.zeros((3, 3)))
    np.testing.assert_array_equal(posterior.starts(with_init([1, 2, 3]), 3, approx), np.tile([1, 2, 3], (3, 1)))
    for bad, message in (("middle", "init must be one of"), ([1, 2], "3 finite numbers"),
                         ([[1, 2, 3]] * 2, "or 3 lists")):
        with pytest.raises(config.ConfigError, match=message):
            posterior.starts(with_init(bad), 3, approx)
    private = {**cfg, "privacy": {"delta": 1e-5}}  # the accountant assumes starts that do not depend on the data
    np.testing.assert_array_equal(posterior.starts(private, 3, approx), np.zeros((3, 3)))
    with pytest.raises(config.ConfigError, match="privacy accountant does not cover"):
        posterior.starts(with_init("dispersed", privacy={"delta": 1e-5}), 3, approx)
    no_check = with_init("zeros")
    no_check["run"]["posterior_check"] = False
    assert config.with_start(no_check, built).laplace[0] is None  # no check and no start from it: no mode search
