"""Data containers, the toy problem, closed forms and the mode finder."""

import numpy as np
import pytest

from fedmcmc import from_clients
from fedmcmc.estimators import gradients
from fedmcmc.data.synthetic import heterogeneous_gaussian
from fedmcmc.app.studies.qlsd_toy_gaussian import running_mse, stationary_ula_posterior
from fedmcmc.models.gaussian import GaussianPosterior, gaussian_mean, gaussian_mean_posterior


def test_toy_problem_follows_the_authors_notebook():
    data = heterogeneous_gaussian()
    assert data.num_clients == 20 and data.x.shape[-1] == 50
    assert data.total == 2042  # N_i = randint(10, 200) with NumPy seed 1994 (PAPER-NOTES)
    assert np.all((data.counts >= 10) & (data.counts < 200))


def test_padding_and_pooling():
    data = from_clients([np.ones((2, 3)), 2 * np.ones((4, 3))])
    assert data.x.shape == (8, 3) and list(data.counts) == [2, 4]  # one bucket of width 4
    assert np.all(data.x[2:4] == 0) and np.all(data.x[4:] == 2) and list(data.starts) == [0, 4]
    # clients of unlike sizes: buckets by size, the rows read scale with the points
    sizes = [3, 300, 5, 310, 4]
    spread = from_clients([np.full((n, 1), i) for i, n in enumerate(sizes)])
    assert spread.groups == ((0, 4, 2), (1, 3)) and spread.x.shape == (3 * 5 + 2 * 310, 1)
    for i, n in enumerate(sizes):
        assert np.all(spread.unpadded(i) == i) and len(spread.unpadded(i)) == n
    rows = spread.rows()
    assert rows.buckets == ((3, 5), (2, 310)) and int(np.sum(np.asarray(rows.row_client) >= 0)) == sum(sizes)
    pooled = data.pooled()
    assert pooled.num_clients == 1 and pooled.total == 6
    with pytest.raises(ValueError, match="no data"):
        from_clients([np.ones((2, 3)), np.ones((0, 3))])
    with pytest.raises(ValueError, match="shape"):
        from_clients([np.ones((2, 3)), np.ones((2, 4))])


def test_closed_form_posterior_with_and_without_prior():
    rng = np.random.default_rng(0)
    clients = [rng.normal(1.0, 1.0, size=(n, 2)) for n in (5, 9)]
    data = from_clients(clients)
    flat = gaussian_mean_posterior(data)
    allx = np.concatenate(clients)
    np.testing.assert_allclose(flat.mean, allx.mean(axis=0))
    assert flat.var == pytest.approx(1 / 14)
    prior = gaussian_mean_posterior(data, noise_scale=2.0, prior_scale=0.5, prior_mean=1.0)
    precision = 14 / 4 + 1 / 0.25
    assert prior.var == pytest.approx(1 / precision)
    np.testing.assert_allclose(prior.mean, (allx.sum(axis=0) / 4 + 1.0 / 0.25) / precision)


def test_expected_norm_matches_monte_carlo():
    post = GaussianPosterior(mean=np.array([3.0, -1.0, 0.5, 0.0]), var=0.7)
    draws = np.linalg.norm(post.sample(np.random.default_rng(1), 400_000), axis=1)
    se = draws.std() / np.sqrt(draws.size)
    assert abs(draws.mean() - post.expected_norm()) < 5 * se


@pytest.mark.parametrize("dim", [4, gradients.FULL_HESSIAN_DIM + 50])
def test_find_mode_recovers_the_posterior_mode_and_the_server_constant(dim):
    """Newton's rounds up to FULL_HESSIAN_DIM parameters, L-BFGS's beyond: the exact posterior mean
    of the Gaussian model, the server's constant sum_i grad U_i(theta*) and the clients' gradients
    at theta*, and the rounds' bits as the docstring counts them."""
    data = heterogeneous_gaussian(num_clients=5, dim=dim)
    for prior in (None, 0.3):
        model = gaussian_mean(dim, prior_scale=prior)
        mode = gradients.find_mode(model, data)
        exact = gaussian_mean_posterior(data, prior_scale=prior)
        np.testing.assert_allclose(mode.theta, exact.mean, atol=1e-4)
        # at the mode sum_i grad U_i = grad log prior
        prior_grad = np.zeros(dim) if prior is None else -np.asarray(mode.theta) / prior**2
        residual = np.linalg.norm(np.asarray(mode.client_grad_sum) - prior_grad)
        assert residual == pytest.approx(mode.gradient_norm, rel=1e-3, abs=1e-4)
        assert mode.gradient_norm <= 1e-3 * data.total
        np.testing.assert_array_equal(np.sum(np.asarray(mode.client_grads, np.float64), 0).astype(np.float32),
                                      mode.client_grad_sum)
        newton, values = 5 * 32 * (1 + 2 * dim + dim * (dim + 1) // 2), 5 * 32 * (1 + dim)
        if dim <= gradients.FULL_HESSIAN_DIM:  # a Gaussian's Newton step is exact: a step, a check, a trial
            assert mode.rounds <= 4 and values * mode.rounds <= mode.bits <= newton * mode.rounds
        else:
            assert mode.rounds > 0 and mode.bits == mode.rounds * 5 * 32 * (1 + 2 * dim)


def test_subset_indices_are_uniform_subsets():
    import jax

    keys = jax.random.split(jax.random.PRNGKey(0), 60_000)
    subsets = np.asarray(jax.jit(jax.vmap(lambda k: gradients.subset_indices(k, 6, 2, 4)))(keys))
    assert np.all(subsets[:, 2:] == 0)
    pairs = np.sort(subsets[:, :2], axis=1)
    assert np.all(pairs[:, 0] < pairs[:, 1]) and pairs.max() < 6
    counts = np.unique(pairs[:, 0] * 6 + pairs[:, 1], return_counts=True)[1]
    assert counts.size == 15  # all binom(6, 2) subsets
    expected = keys.shape[0] / 15
    chi2 = np.sum((counts - expected) ** 2 / expected)
    assert chi2 < 14 + 5 * np.sqrt(2 * 14)  # 14 degrees of freedom, 5 sd


@pytest.mark.parametrize("count, n, k", [(30, 10, 12), (2042, 40, 40), (50, 50, 50), (2042, 200, 200)])
def test_subset_indices_equal_sequential_floyd(count, n, k):
    """Both vectorised paths (bitmask for k <= 24, fixed point above) give Floyd's output."""
    import jax

    keys = jax.random.split(jax.random.PRNGKey(7), 300)
    ours = np.asarray(jax.jit(jax.vmap(lambda key: gradients.subset_indices(key, count, n, k)))(keys))
    for key, got in zip(keys, ours):
        u = np.asarray(jax.random.uniform(key, (k,)))
        chosen = []
        for t in range(n):
            j = count - n + t
            r = min(int(np.float32(u[t]) * np.float32(j + 1)), j)
            chosen.append(j if r in chosen else r)
        assert got[:n].tolist() == chosen
        assert np.all(got[n:] == 0)


@pytest.mark.slow
@pytest.mark.parametrize("partitionable", [True, False])
@pytest.mark.parametrize("sizes", [[19, 10, 4, 9, 8, 4, 16, 1, 9, 1, 4, 16], [90, 2, 25, 7, 30, 11, 3, 6, 20, 9, 14, 1]])
def test_minibatches_by_bucket_are_each_clients_own(sizes, partitionable):
    """Under vmap over every client, clients of other batch sizes draw in other buckets
    (``gradients.on_minibatch``), at their bucket's width: each client's subset and weights are
    those it draws alone at the full width (Floyd for the first sizes, top-k for the second:
    90^2 > 60 * 100), with either threefry stream of JAX."""
    import jax
    import jax.numpy as jnp

    from fedmcmc.core.base import CLIENT_AXES

    counts = [100, 12, 40, 9, 14, 5, 25, 3, 10, 2, 14, 6]
    data = from_clients([np.zeros((n, 1)) for n in counts])
    rows = data.rows()
    x = np.zeros(rows.row_client.shape + (1,), np.float32)
    x[:, 0] = np.arange(x.shape[0])  # each row holds its own index
    data = data._replace(x=x)
    total = x.shape[0]
    dim = 10**6  # compiling a bucket then costs next to nothing: many buckets
    assert len(gradients.minibatch_buckets(np.asarray(sizes), dim)) > 2

    def drawn(xb, w):  # the weight of every row of the data: the subset and its weights, exactly
        return jnp.zeros((total,), jnp.float32).at[xb[:, 0].astype(jnp.int32)].add(w)

    draw = gradients.on_minibatch(np.asarray(sizes, np.int32), drawn, dim)
    keys = jax.random.split(jax.random.PRNGKey(5), len(counts))
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())
    with jax.threefry_partitionable(partitionable):
        together = np.asarray(jax.jit(jax.vmap(draw, (0, CLIENT_AXES)))(keys, clients))
        alone = [np.asarray(jax.jit(draw)(keys[i], jax.tree_util.tree_map(jnp.asarray, data.client(i))))
                 for i in range(len(counts))]
    for i, n in enumerate(counts):
        np.testing.assert_array_equal(together[i], alone[i])
        assert np.count_nonzero(alone[i]) == min(sizes[i], n)
        assert set(np.flatnonzero(alone[i])) <= set(np.flatnonzero(np.asarray(rows.row_client) == i))


def test_ula_stationary_law_and_running_mse():
    post = GaussianPosterior(mean=np.zeros(3), var=0.01)
    ula = stationary_ula_posterior(post, 0.01)  # gamma L = 1: twice the variance
    assert ula.var == pytest.approx(0.02)
    with pytest.raises(ValueError, match="unstable"):
        stationary_ula_posterior(post, 0.02)
    stats = np.array([[1.0, 3.0], [2.0, 2.0]])
    ends, mse = running_mse(stats, 2.0, 2)
    assert list(ends) == [1, 2]
    np.testing.assert_allclose(mse, [0.5, 0.0])


def test_section_5_2_global_posterior_is_the_papers():
    from fedmcmc.data.synthetic import heterogeneous_local_posteriors
    from fedmcmc.models import gaussian_factors_posterior

    post = gaussian_factors_posterior(heterogeneous_local_posteriors(3))
    np.testing.assert_allclose(post.mean, 16.2)
    assert post.var == pytest.approx(1.6)
    # reading the paper's "N(1_d, 2 I)" as a variance instead gives another posterior
    other = gaussian_factors_posterior(heterogeneous_local_posteriors(3, scales=(1.0, np.sqrt(2.0))))
    assert other.mean[0] == pytest.approx(41 / 3) and other.var == pytest.approx(4 / 3)


def test_logistic_data_shapes_and_weights():
    from fedmcmc.data.synthetic import logistic_regression_data

    data, theta = logistic_regression_data(seed=0, dim=7, num_points=100, num_clients=5)
    assert data.num_clients == 5 and data.total == 100 and theta.shape == (7,)
    np.testing.assert_allclose(data.weights, 0.2)
    with pytest.raises(ValueError, match="multiple"):
        logistic_regression_data(num_points=101, num_clients=5)


def test_predict_of_the_regression_models_matches_their_likelihoods():
    import jax
    import jax.numpy as jnp

    from fedmcmc.models import linear_regression, logistic_regression

    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((6, 3)), jnp.float32)
    theta = jnp.asarray([0.5, -1.0, 2.0])
    model = logistic_regression(3)
    probs = np.asarray(model.predict(theta, x))
    p1 = np.exp(np.asarray(jax.vmap(model.log_likelihood, (None, 0))(theta, (x, jnp.ones(6)))))
    np.testing.assert_allclose(probs[:, 1], p1, rtol=1e-5)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    lin = linear_regression(3, noise_scale=0.5)
    mean = np.asarray(lin.predict(theta, x))
    # the log-likelihood is largest at y = the predictive mean
    ll = jax.vmap(lin.log_likelihood, (None, 0))
    assert np.all(np.asarray(ll(theta, (x, jnp.asarray(mean)))) > np.asarray(ll(theta, (x, jnp.asarray(mean) + 0.1))))


def test_a_data_point_that_is_not_finite_is_named():
    clients = [np.ones((3, 2)), np.ones((4, 2))]
    clients[1][2, 1] = np.inf
    with pytest.raises(ValueError, match=r"client 1: data point 2 holds NaN or inf"):
        from_clients(clients)
    with pytest.raises(ValueError, match=r"client 0: data point 0 holds NaN or inf \(as float32\)"):
        from_clients([(np.full((2, 1), 1e39), np.zeros(2, np.int32))])  # too large for float32


def test_a_mode_search_that_reaches_nan_says_so():
    import fedmcmc
    import jax.numpy as jnp

    model = fedmcmc.Model(lambda theta, x: jnp.sum(theta * x) - jnp.sqrt(theta[0]), lambda theta: 0.0, 2)  # grad inf at 0
    with pytest.raises(ValueError, match="federated mode .* reached NaN or inf"):
        gradients.find_mode(model, from_clients([np.ones((3, 2)), -np.ones((2, 2))]))
