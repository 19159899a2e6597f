"""Classifiers on flat parameter vectors: softmax regression, MLP, LeNet-5, tempering."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc import from_clients
from fedmcmc.estimators import gradients
from fedmcmc.models.layout import ParamLayout, initial_position
from fedmcmc.models.lenet import lenet5, lenet5_layout
from fedmcmc.models.logistic import logistic_regression
from fedmcmc.models.mlp import mlp, mlp_layout
from fedmcmc.models.softmax import multinomial_layout, multinomial_logistic_regression
from fedmcmc.models.tempered import tempered


def _vmap_ll(model, theta, x, y):
    return jax.jit(jax.vmap(model.log_likelihood, in_axes=(None, 0)))(theta, (x, y))


def _data(rng, n, shape, k):
    return rng.normal(size=(n,) + tuple(shape)), rng.integers(0, k, n)


# ----------------------------------------------------------------------------------- layouts

def test_parameter_counts():
    assert lenet5().dim == lenet5_layout().dim == 61_706
    assert lenet5(input_shape=(28, 28)).dim == 61_706
    shapes = lenet5_layout().shapes
    assert shapes["conv1/w"] == (5, 5, 1, 6) and shapes["conv2/w"] == (5, 5, 6, 16)
    assert shapes["dense1/w"] == (400, 120) and shapes["dense3/w"] == (84, 10)
    assert lenet5(input_shape=(32, 32, 3)).dim == 5 * 5 * 3 * 6 + 6 + 2416 + (576 * 120 + 120) + 10164 + 850
    for input_dim, hidden, k in [(784, (100,), 10), (18, (18, 8), 1), (5, (), 3), (7, (4, 3, 2), 2)]:
        widths = [input_dim, *hidden, k]
        expected = sum((a + 1) * b for a, b in zip(widths[:-1], widths[1:]))
        assert mlp(input_dim, hidden, k).dim == mlp_layout(input_dim, hidden, k).dim == expected
    assert mlp(18, (18, 8), 1).dim == 503
    assert multinomial_logistic_regression(6, 4).dim == 6 * 4 + 4
    assert multinomial_logistic_regression(6, 4, intercept=False).dim == 24


def test_unflatten_flatten_round_trip():
    layout = lenet5_layout(input_shape=(12, 12, 2), num_classes=3)
    theta = jnp.arange(layout.dim, dtype=jnp.float32)
    params = layout.unflatten(theta)
    assert list(params) == list(layout.names)
    assert {k: v.shape for k, v in params.items()} == layout.shapes == layout.param_shapes
    np.testing.assert_array_equal(layout.flatten(params), theta)
    # blocks are contiguous, in order, row-major
    sl = layout.slices
    assert sl["conv1/w"].start == 0 and sl["dense3/b"].stop == layout.dim
    np.testing.assert_array_equal(params["conv1/b"], theta[sl["conv1/b"]])
    np.testing.assert_array_equal(params["conv1/w"][0, 0, 1], theta[6:12])
    # leading batch axes (e.g. posterior draws) are kept
    draws = jnp.stack([theta, -theta, 2 * theta])
    batched = layout.unflatten(draws)
    assert batched["dense1/w"].shape == (3,) + layout.shapes["dense1/w"]
    np.testing.assert_array_equal(layout.flatten(batched), draws)
    with pytest.raises(ValueError, match="last axis"):
        layout.unflatten(theta[:-1])
    with pytest.raises(ValueError, match="missing"):
        layout.flatten({"conv1/w": params["conv1/w"]})
    with pytest.raises(ValueError, match="distinct"):
        ParamLayout(("a", "a"), ((1,), (2,)), (0.0, 0.0))


@pytest.mark.slow
def test_initial_position_scales():
    layout = mlp_layout(400, (300,), 10, activation="relu")
    theta = initial_position(jax.random.key(0), layout)
    assert theta.dtype == jnp.float32 and theta.shape == (layout.dim,)
    p = layout.unflatten(theta)
    assert np.std(p["dense1/w"]) == pytest.approx(math.sqrt(2 / 400), rel=0.02)  # He before ReLU
    assert np.std(p["dense2/w"]) == pytest.approx(math.sqrt(2 / 310), rel=0.05)  # Glorot at the output
    assert np.all(p["dense1/b"] == 0) and np.all(p["dense2/b"] == 0)
    tanh = mlp_layout(400, (300,), 10, activation="tanh").unflatten(initial_position(jax.random.key(0),
                                                                         mlp_layout(400, (300,), 10, "tanh")))
    assert np.std(tanh["dense1/w"]) == pytest.approx(math.sqrt(2 / 700), rel=0.02)
    lenet = lenet5_layout().unflatten(initial_position(jax.random.key(1), lenet5_layout()))
    assert np.std(lenet["conv2/w"]) == pytest.approx(math.sqrt(2 / 150), rel=0.05)
    np.testing.assert_array_equal(initial_position(jax.random.key(1), lenet5_layout()),
                                  initial_position(jax.random.key(1), lenet5_layout()))
    assert not np.any(initial_position(jax.random.key(2), multinomial_layout(5, 3)))  # log-concave: start at 0


# ------------------------------------------------------------------------------ gradients

def _directional_fd_check(model, theta, datum, key, num_dirs=4, eps=1e-5):
    """grad . v against central differences along random directions, in float64."""
    f = jax.jit(lambda t: model.log_likelihood(t, datum))
    g = jax.jit(jax.grad(f))(theta)
    for v in jax.random.normal(key, (num_dirs, theta.size), jnp.float64):
        fd = (f(theta + eps * v) - f(theta - eps * v)) / (2 * eps)
        assert float(jnp.dot(g, v)) == pytest.approx(float(fd), rel=1e-6, abs=1e-7)
    return f, g


@pytest.mark.slow
@pytest.mark.parametrize("which", ["softmax", "mlp-relu", "mlp-tanh-binary", "lenet-relu-max", "lenet-tanh-avg"])
def test_log_likelihood_gradient_matches_finite_differences(which):
    rng = np.random.default_rng(3)
    with jax.enable_x64(True):
        if which == "softmax":
            model, layout, shape = multinomial_logistic_regression(4, 3), multinomial_layout(4, 3), (4,)
            k = 3
        elif which == "mlp-relu":
            model, layout, shape, k = mlp(5, (6, 4), 3), mlp_layout(5, (6, 4), 3), (5,), 3
        elif which == "mlp-tanh-binary":
            model, layout, shape, k = mlp(5, (6,), 1, "tanh"), mlp_layout(5, (6,), 1, "tanh"), (5,), 2
        else:
            act, pool = which.split("-")[1:]
            model = lenet5((12, 12, 2), 3, activation=act, pooling=pool)
            layout, shape, k = lenet5_layout((12, 12, 2), 3, act), (12, 12, 2), 3
        theta = initial_position(jax.random.key(0), layout, jnp.float64)
        theta = theta + 0.1 * jax.random.normal(jax.random.key(1), theta.shape, jnp.float64)
        x = jnp.asarray(rng.normal(size=shape))
        y = jnp.asarray(int(rng.integers(0, k)))
        f, g = _directional_fd_check(model, theta, (x, y), jax.random.key(2))
        assert g.dtype == jnp.float64
        eps = 1e-6  # and a few single coordinates in every block
        for name, sl in layout.slices.items():
            for j in rng.choice(np.arange(sl.start, sl.stop), size=min(3, sl.stop - sl.start), replace=False):
                e = jnp.zeros_like(theta).at[j].set(eps)
                fd = (f(theta + e) - f(theta - e)) / (2 * eps)
                assert float(g[j]) == pytest.approx(float(fd), rel=1e-5, abs=1e-8), (name, j)


@pytest.mark.slow
def test_lenet_minibatch_gradient_equals_batched_network_gradient():
    """The per-datum vmap the samplers use agrees with one pass of the network on the batch,
    and padding rows (weight 0) do not count."""
    model, layout = lenet5(), lenet5_layout()
    rng = np.random.default_rng(0)
    x, y = rng.random((32, 28, 28)).astype(np.float32), rng.integers(0, 10, 32)
    w = np.where(np.arange(32) < 29, 3.0, 0.0).astype(np.float32)
    theta = initial_position(jax.random.key(0), layout)
    g = jax.jit(lambda t: gradients.weighted_potential_grad(model, t, (x, y), w))(theta)

    def potential(t):
        p = model.predict(t, x)
        return -jnp.sum(w * jnp.log(p[jnp.arange(32), y]))

    ref = jax.jit(jax.grad(potential))(theta)
    np.testing.assert_allclose(g, ref, rtol=1e-3, atol=1e-3 * float(jnp.max(jnp.abs(ref))))
    g29 = jax.jit(lambda t: gradients.weighted_potential_grad(model, t, (x[:29], y[:29]), w[:29]))(theta)
    np.testing.assert_allclose(g, g29, rtol=1e-3, atol=1e-3 * float(jnp.max(jnp.abs(ref))))


def test_minibatch_oracle_runs_on_uint8_images():
    rng = np.random.default_rng(1)
    clients = [(rng.integers(0, 256, (n, 28, 28)).astype(np.uint8), rng.integers(0, 10, n).astype(np.int32))
               for n in (40, 25)]
    data = from_clients(clients)
    assert data.x[0].dtype == np.uint8  # integer leaves are kept; the model casts them
    model = lenet5()
    theta = initial_position(jax.random.key(0), lenet5_layout()) * 0.05
    oracle = jax.jit(gradients.minibatch_gradient(model, batch_size=8))
    h = oracle(jax.random.key(1), theta, data.client(1))
    assert h.shape == (model.dim,) and bool(jnp.all(jnp.isfinite(h)))


# -------------------------------------------------------------------------- likelihoods

@pytest.mark.slow
@pytest.mark.parametrize("which", ["softmax", "mlp", "mlp-binary", "lenet"])
def test_predict_is_a_distribution_matching_the_likelihood(which):
    rng = np.random.default_rng(4)
    if which == "softmax":
        model, layout, shape, k = multinomial_logistic_regression(6, 4), multinomial_layout(6, 4), (6,), 4
    elif which == "mlp":
        model, layout, shape, k = mlp(6, (8,), 4), mlp_layout(6, (8,), 4), (6,), 4
    elif which == "mlp-binary":
        model, layout, shape, k = mlp(6, (8, 3), 1), mlp_layout(6, (8, 3), 1), (6,), 2
    else:
        model, layout, shape, k = lenet5((14, 14, 1), 4), lenet5_layout((14, 14, 1), 4), (14, 14, 1), 4
    theta = initial_position(jax.random.key(5), layout) + 0.3 * jax.random.normal(jax.random.key(6), (layout.dim,))
    x, _ = _data(rng, 7, shape, k)
    x = jnp.asarray(x, jnp.float32)
    p = model.predict(theta, x)
    assert p.shape == (7, k)
    np.testing.assert_allclose(jnp.sum(p, axis=1), 1.0, rtol=1e-5)
    for label in range(k):
        ll = _vmap_ll(model, theta, x, jnp.full((7,), label))
        np.testing.assert_allclose(jnp.exp(ll), p[:, label], rtol=2e-5, atol=1e-7)


def test_multinomial_with_two_classes_is_binary_logistic_regression():
    rng = np.random.default_rng(7)
    x, y = _data(rng, 20, (5,), 2)
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y)
    w = jnp.asarray(rng.normal(size=5), jnp.float32)
    binary = logistic_regression(5)
    multi = multinomial_logistic_regression(5, 2, intercept=False)
    theta = multinomial_layout(5, 2, intercept=False).flatten({"W": jnp.stack([jnp.zeros(5), w], axis=1)})
    np.testing.assert_allclose(_vmap_ll(multi, theta, x, y), _vmap_ll(binary, w, x, y.astype(jnp.float32)),
                               rtol=1e-5, atol=1e-6)
    assert float(multi.log_prior(theta)) == pytest.approx(float(binary.log_prior(w)))
    # with an intercept: b[1] - b[0] is the binary model's bias on a column of ones
    multi_b = multinomial_logistic_regression(5, 2)
    theta_b = multinomial_layout(5, 2).flatten({"W": jnp.stack([jnp.zeros(5), w], axis=1),
                                                "b": jnp.array([0.5, 1.25])})
    x1 = jnp.concatenate([x, jnp.ones((20, 1))], axis=1)
    np.testing.assert_allclose(_vmap_ll(multi_b, theta_b, x, y),
                               _vmap_ll(logistic_regression(6), jnp.append(w, 0.75), x1, y.astype(jnp.float32)),
                               rtol=1e-5, atol=1e-6)
    # an MLP without hidden layers and one logit is binary logistic regression with a bias
    net = mlp(5, hidden=(), num_classes=1)
    theta_n = mlp_layout(5, (), 1).flatten({"dense1/w": w[:, None], "dense1/b": jnp.array([0.75])})
    np.testing.assert_allclose(_vmap_ll(net, theta_n, x, y),
                               _vmap_ll(logistic_regression(6), jnp.append(w, 0.75), x1, y.astype(jnp.float32)),
                               rtol=1e-5, atol=1e-6)


def test_prior_is_counted_once_in_log_prior():
    rng = np.random.default_rng(8)
    for build in (lambda s: multinomial_logistic_regression(4, 3, prior_scale=s),
                  lambda s: mlp(4, (5,), 3, prior_scale=s),
                  lambda s: lenet5((12, 12, 1), 3, prior_scale=s)):
        m1, m2 = build(1.0), build(0.5)
        theta = jnp.asarray(rng.normal(size=m1.dim), jnp.float32)
        expected = -0.5 * float(jnp.sum(theta**2))
        assert float(m1.log_prior(theta)) == pytest.approx(expected, rel=1e-5)
        assert float(m2.log_prior(theta)) == pytest.approx(expected / 0.25, rel=1e-5)
        # the prior is not in the per-datum likelihood
        x = jnp.asarray(rng.normal(size=(12, 12, 1) if m1.name.startswith("lenet") else (4,)), jnp.float32)
        assert float(jax.jit(m1.log_likelihood)(theta, (x, 1))) == float(jax.jit(m2.log_likelihood)(theta, (x, 1)))
    with pytest.raises(ValueError, match="prior_scale"):
        mlp(4, (5,), 3, prior_scale=0.0)


def test_tempered_divides_likelihood_and_prior():
    model = mlp(4, (5,), 3)
    rng = np.random.default_rng(9)
    theta = jnp.asarray(rng.normal(size=model.dim), jnp.float32)
    x = jnp.asarray(rng.normal(size=(6, 4)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, 6))
    assert tempered(model, 1.0) is model
    for t in (0.1, 0.5, 3.0):
        cold = tempered(model, t)
        assert cold.dim == model.dim and cold.name == f"{model.name}-T{t:g}"
        np.testing.assert_allclose(_vmap_ll(cold, theta, x, y), _vmap_ll(model, theta, x, y) / t, rtol=1e-6)
        assert float(cold.log_prior(theta)) == pytest.approx(float(model.log_prior(theta)) / t, rel=1e-6)
        np.testing.assert_array_equal(cold.predict(theta, x), model.predict(theta, x))
        grad = jax.jit(gradients.weighted_potential_grad, static_argnums=0)
        np.testing.assert_allclose(grad(cold, theta, (x, y), jnp.ones(6)),
                                   grad(model, theta, (x, y), jnp.ones(6)) / t, rtol=1e-5, atol=1e-6)
    for bad in (0.0, -1.0, float("nan"), float("inf"), "cold"):
        with pytest.raises(ValueError, match="temperature"):
            tempered(model, bad)


# ------------------------------------------------------------------------------- inputs

def _numpy_lenet(params, x, act, pool):
    """An independent LeNet-5 forward pass for one ``[H, W, C]`` input (loops, float64)."""
    f = np.tanh if act == "tanh" else (lambda a: np.maximum(a, 0))

    def conv(x, k, b, pad):
        if pad:
            x = np.pad(x, ((2, 2), (2, 2), (0, 0)))
        h, w = x.shape[0] - 4, x.shape[1] - 4
        out = np.empty((h, w, k.shape[-1]))
        for i in range(h):
            for j in range(w):
                out[i, j] = np.einsum("abc,abco->o", x[i:i + 5, j:j + 5], k) + b
        return out

    def pooled(x):
        h, w = x.shape[0] // 2, x.shape[1] // 2
        blocks = x[:2 * h, :2 * w].reshape(h, 2, w, 2, -1)
        return blocks.max(axis=(1, 3)) if pool == "max" else blocks.mean(axis=(1, 3))

    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    z = pooled(f(conv(x, p["conv1/w"], p["conv1/b"], True)))
    z = pooled(f(conv(z, p["conv2/w"], p["conv2/b"], False))).reshape(-1)
    z = f(z @ p["dense1/w"] + p["dense1/b"])
    z = f(z @ p["dense2/w"] + p["dense2/b"])
    z = z @ p["dense3/w"] + p["dense3/b"]
    return np.exp(z - z.max()) / np.exp(z - z.max()).sum()


@pytest.mark.parametrize("act,pool", [("relu", "max"), ("tanh", "avg")])
def test_lenet_matches_an_independent_implementation(act, pool):
    shape = (13, 15, 2)  # odd sizes: the last row/column is dropped by the pools
    layout = lenet5_layout(shape, 3, act)
    model = lenet5(shape, 3, activation=act, pooling=pool)
    theta = initial_position(jax.random.key(3), layout) + 0.05 * jax.random.normal(jax.random.key(4), (layout.dim,))
    x = np.random.default_rng(10).normal(size=(2,) + shape).astype(np.float32)
    p = model.predict(theta, x)
    params = layout.unflatten(theta)
    for i in range(2):
        np.testing.assert_allclose(p[i], _numpy_lenet(params, x[i].astype(np.float64), act, pool), rtol=1e-4)


@pytest.mark.slow
def test_input_shapes():
    model, layout = lenet5(), lenet5_layout()
    theta = initial_position(jax.random.key(0), layout)
    rng = np.random.default_rng(11)
    img = jnp.asarray(rng.random((3, 28, 28)), jnp.float32)
    p = model.predict(theta, img)
    np.testing.assert_allclose(model.predict(theta, img[..., None]), p, rtol=1e-6)
    np.testing.assert_allclose(model.predict(theta, img.reshape(3, 784)), p, rtol=1e-6)
    ll = jax.jit(model.log_likelihood)
    for x in (img[0], img[0, ..., None], img[0].reshape(784)):
        assert float(ll(theta, (x, 2))) == pytest.approx(float(jnp.log(p[0, 2])), rel=1e-5)
    # labels given as floats (e.g. cast by a data pipeline) are read as integers
    assert float(ll(theta, (img[0], 2.0))) == pytest.approx(float(jnp.log(p[0, 2])), rel=1e-5)
    with pytest.raises(ValueError, match="784 entries"):
        model.log_likelihood(theta, (jnp.zeros((27, 28)), 0))
    with pytest.raises(ValueError, match="784 entries"):
        model.predict(theta, jnp.zeros((3, 27, 28)))
    # an MLP flattens images too
    net = mlp(784, (16,), 10)
    t = initial_position(jax.random.key(1), mlp_layout(784, (16,), 10))
    np.testing.assert_allclose(net.predict(t, img), net.predict(t, img.reshape(3, 784)), rtol=1e-6)
    with pytest.raises(ValueError, match="784 entries"):
        net.log_likelihood(t, (jnp.zeros(783), 0))


def test_invalid_settings():
    with pytest.raises(ValueError, match="activation"):
        mlp(4, (5,), 3, activation="sigmoid")
    with pytest.raises(ValueError, match="pooling"):
        lenet5(pooling="median")
    with pytest.raises(ValueError, match="at least 12x12"):
        lenet5(input_shape=(10, 10, 1))
    with pytest.raises(ValueError, match="num_classes"):
        multinomial_logistic_regression(4, 1)
    with pytest.raises(ValueError, match="num_classes"):
        lenet5(num_classes=1)
    with pytest.raises(ValueError, match="hidden"):
        mlp(4, (5, 0), 3)
    with pytest.raises(ValueError, match="input_shape"):
        lenet5(input_shape=(28,))
