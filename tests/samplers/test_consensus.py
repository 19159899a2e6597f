"""The one-shot combinations of subposteriors: consensus Monte Carlo (Scott et al. 2016) and the
Gaussian product (Neiswanger et al. 2014, parametric).

On Gaussian clients with a Gaussian prior every subposterior ``p(x_s | theta) p(theta)^{1 / S}``
is Gaussian, of precision ``lam_s = N_s + 1 / (S tau^2)`` and mean ``N_s xbar_s / lam_s``. The
local ULA chain of step ``gamma`` (exact gradients) has the exact mean and the variance
``1 / w_s``, ``w_s = lam_s (1 - gamma lam_s / 2)``: both combinations of exact draws of these
Gaussians give the Gaussian of precision ``sum_s w_s`` and mean ``sum_s w_s m_s / sum_s w_s``,
which is the exact posterior as ``gamma -> 0``. The checks compare each chain's time average
(its mean) and its within-chain variance with those, within 5 standard errors across
independent chains (``tests/harness.py``); the unweighted average of the sites' draws fails the
same checks by far on these heterogeneous clients.
"""

import numpy as np
import pytest

import harness
from fedmcmc.app import config
from fedmcmc.app.config import ConfigError
from fedmcmc.data.synthetic import logistic_regression_data
from fedmcmc.models.gaussian import gaussian_mean, gaussian_mean_posterior
from fedmcmc.models.logistic import logistic_regression
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers import consensus_mc, gaussian_product
from fedmcmc.samplers.consensus_mc import ConsensusState

SIZES, DIM, TAU = (20, 35, 50, 80), 3, 0.5
GAMMA, STEPS, DRAWS, BURN, CHAINS = 5e-3, 10_000, 1000, 500, 50


@pytest.fixture(scope="module")
def gaussian():
    data = harness.problem(sizes=SIZES, dim=DIM, spread=1.0, seed=3)
    model = gaussian_mean(DIM, prior_scale=TAU)
    xs = harness.client_arrays(data)
    lam = np.array([x.shape[0] + 1.0 / (len(xs) * TAU**2) for x in xs])
    means = np.stack([x.sum(axis=0) for x in xs]) / lam[:, None]
    w = lam * (1 - GAMMA * lam / 2)  # the ULA chains' stationary precisions
    target = (w[:, None] * means).sum(axis=0) / w.sum(), 1.0 / w.sum()
    naive = means.mean(axis=0), np.sum(1.0 / w) / len(xs) ** 2  # the unweighted average of the sites' draws
    return data, model, target, naive


def _draws(sampler, data, seed=0):
    """``[chain, G, d]``: one round of every chain, started at the posterior mean."""
    return np.asarray(simulate(seed, sampler, data, harness.xbar(data), 1, num_chains=CHAINS).samples, np.float64)


def _check(samples, mean, var, what):
    """Each chain's time average against ``mean`` and its within-chain variance against ``var``."""
    harness.assert_close(samples.mean(axis=1), mean, f"{what} mean")
    harness.assert_close(samples.var(axis=1, ddof=1), np.full(DIM, var), f"{what} variance")


def _naive(sampler):
    """The same sites, combined by the unweighted average of their draws."""
    def server_step(key, server_state, uploads, mask, k):
        state, broadcast, info = sampler.server_step(key, server_state, uploads, mask, k)
        draws = uploads.draws.mean(axis=0)
        return ConsensusState(draws[-1], draws), broadcast._replace(position=draws[-1]), info

    return sampler._replace(server_step=server_step, name="naive-average")


def _consensus(model, weighting="covariance"):
    return consensus_mc(model, len(SIZES), GAMMA, STEPS, num_draws=DRAWS, local_burn_in=BURN, weighting=weighting)


def test_the_targets_tend_to_the_exact_posterior(gaussian):
    """The ULA-accounted target is the exact posterior up to the step's O(gamma lam) terms."""
    data, _, (mean, var), _ = gaussian
    exact = gaussian_mean_posterior(data, prior_scale=TAU)
    assert abs(var / exact.var - 1) < GAMMA * max(SIZES)
    np.testing.assert_allclose(mean, exact.mean, atol=GAMMA * max(SIZES) * np.abs(exact.mean).max())


@pytest.mark.slow
@pytest.mark.parametrize("weighting", ["covariance", "diagonal"])
def test_consensus_mc_is_exact_for_gaussian_subposteriors(gaussian, weighting):
    data, model, (mean, var), _ = gaussian
    _check(_draws(_consensus(model, weighting), data), mean, var, f"consensus-mc ({weighting})")


@pytest.mark.slow
def test_gaussian_product_is_exact_for_gaussian_subposteriors(gaussian):
    data, model, (mean, var), _ = gaussian
    sampler = gaussian_product(model, len(SIZES), GAMMA, STEPS, num_draws=DRAWS, local_burn_in=BURN)
    _check(_draws(sampler, data), mean, var, "gaussian-product")


@pytest.mark.slow
def test_the_unweighted_average_fails_the_same_checks(gaussian):
    """Naive averaging of the same draws matches its own (wrong) law and not the posterior's."""
    data, model, (mean, var), (naive_mean, naive_var) = gaussian
    samples = _draws(_naive(_consensus(model)), data)
    _check(samples, naive_mean, naive_var, "naive average (its own law)")
    with pytest.raises(AssertionError, match="mean"):
        harness.assert_close(samples.mean(axis=1), mean, "naive mean")
    with pytest.raises(AssertionError, match="variance"):
        harness.assert_close(samples.var(axis=1, ddof=1), np.full(DIM, var), "naive variance")


@pytest.mark.slow
@pytest.mark.parametrize("build", [consensus_mc, gaussian_product])
def test_a_non_gaussian_model_runs_with_minibatches(build):
    """Logistic regression: the combinations are biased there (the papers' point); they run, with
    ``G`` finite draws a round over several rounds, and count their uploads."""
    data, _ = logistic_regression_data(seed=0, dim=3, num_points=200, num_clients=4)
    model = logistic_regression(3)
    sampler = build(model, 4, 1e-2, 40, num_draws=10, local_burn_in=20, batch_size=10)
    result = simulate(0, sampler, data, np.zeros(3), 3, num_chains=2)
    assert sampler.draws_per_round == 10
    assert np.shape(result.samples) == (2, 30, 3)
    assert np.all(np.isfinite(result.samples))


@pytest.mark.slow
def test_uploads_are_counted_as_sent():
    """Consensus MC uploads ``G d`` floats a site; the Gaussian product ``d + d (d + 1) / 2``."""
    data = harness.problem(sizes=(10, 12), dim=DIM)
    model = gaussian_mean(DIM)
    for sampler, floats in [(consensus_mc(model, 2, 1e-2, 8), 8 * DIM),
                            (gaussian_product(model, 2, 1e-2, 8), DIM + DIM * (DIM + 1) // 2)]:
        result = simulate(0, sampler, data, np.zeros(DIM), 2, num_chains=1)
        assert np.all(np.asarray(result.total_bits_up) == 2 * 32 * floats * data.num_clients), sampler.name


@pytest.mark.parametrize("kwargs, message", [
    ({"num_draws": 3}, "must divide local_steps"),
    ({"num_draws": 2}, "num_draws > dim"),
    ({"weighting": "median"}, "weighting"),
    ({"num_draws": 1, "weighting": "diagonal"}, "at least 2"),
    ({"local_burn_in": -1}, "local_burn_in"),
    ({"local_burn_in": 2.5}, "whole number"),
])
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as info:
        consensus_mc(gaussian_mean(DIM), 2, 1e-2, 8, **kwargs)
    assert "\n" not in str(info.value)


def test_the_gaussian_product_needs_more_draws_than_dimensions():
    with pytest.raises(ValueError, match="num_draws > dim"):
        gaussian_product(gaussian_mean(DIM), 2, 1e-2, 8, num_draws=2)


@pytest.mark.parametrize("name", ["consensus-mc", "gaussian-product"])
def test_partial_participation_is_refused_by_the_config(name):
    """A one-shot combination needs every site: the builders take no participation scheme."""
    cfg = config.example(name)
    cfg["sampler"]["participation"] = {"p": 0.5}
    with pytest.raises(ConfigError, match="participation"):
        config.validate(cfg)


@pytest.mark.slow
def test_an_untempered_prior_fails_the_same_checks(gaussian):
    """Every site taking the whole prior (``p(theta)^S`` in the product, the prior of scale
    ``tau / sqrt(S)`` tempered by ``1 / S``) is told apart: the prior share is checked."""
    data, _, (mean, var), _ = gaussian
    samples = _draws(_consensus(gaussian_mean(DIM, prior_scale=TAU / np.sqrt(len(SIZES)))), data)
    with pytest.raises(AssertionError, match="variance"):
        harness.assert_close(samples.var(axis=1, ddof=1), np.full(DIM, var), "untempered variance")


@pytest.mark.slow
@pytest.mark.parametrize("build", [consensus_mc, gaussian_product])
def test_a_round_that_misses_a_site_keeps_the_previous_draws(build):
    """A Flower client past its timeout is inactive: the server holds its last combination."""
    import jax
    import jax.numpy as jnp

    sampler = build(gaussian_mean(DIM), 2, 1e-2, 8)
    data = harness.problem(sizes=(10, 12), dim=DIM)
    state, broadcast = sampler.init(jax.random.key(0), jnp.ones(DIM))
    uploads = []
    for i in range(2):
        client = data.client(i)
        client_state = sampler.client_init(jax.random.key(i), broadcast, client)
        uploads.append(sampler.client_step(jax.random.key(i), client_state, broadcast, client, 0)[1])
    uploads = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *uploads)
    held, _, _ = sampler.server_step(jax.random.key(1), state, uploads, jnp.array([True, False]), 0)
    moved, _, _ = sampler.server_step(jax.random.key(1), state, uploads, jnp.array([True, True]), 0)
    np.testing.assert_array_equal(held.draws, state.draws)
    assert np.all(np.isfinite(moved.draws)) and not np.array_equal(moved.draws, state.draws)
