"""The whitened model (theta = c + L z) is the model through the map: its potential and gradient
are the original's at theta (gradient L^T grad U), for a full and a diagonal factor, and the
maps of draws and starting points are each other's inverses."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.data import partition
from fedmcmc.estimators.gradients import potential
from fedmcmc.models import Whitening, linear_regression, whitened


def _problem(d=4, n=60, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, d)) * np.logspace(-1, 1, d)).astype(np.float32)
    y = (x @ rng.normal(size=d) + rng.normal(size=n)).astype(np.float32)
    data = partition.federate(x, y, np.array_split(np.arange(n), 3))
    return data, linear_regression(d), rng


def _factors(d, rng):
    lower = np.tril(rng.normal(size=(d, d)) * 0.3) + np.diag(rng.uniform(0.5, 2.0, d))
    return {"full": lower, "diagonal": rng.uniform(0.1, 3.0, d)}


@pytest.mark.parametrize("kind", ["full", "diagonal"])
def test_potential_and_gradient_are_the_models_through_the_map(kind):
    data, model, rng = _problem()
    d = model.dim
    centre, factor = rng.normal(size=d), _factors(d, rng)[kind]
    w = Whitening(centre, factor)
    model_z = whitened(model, centre, factor)
    rows = jax.tree_util.tree_map(jnp.asarray, data.rows())
    u, u_z = potential(model, rows), potential(model_z, rows)
    lower = factor if kind == "full" else np.diag(factor)
    for z in rng.normal(size=(3, d)):
        theta = w.to_theta(z)
        np.testing.assert_allclose(theta, centre + lower @ z, rtol=1e-12)
        np.testing.assert_allclose(u_z(jnp.asarray(z, jnp.float32)), u(jnp.asarray(theta, jnp.float32)), rtol=1e-5)
        g_z = np.asarray(jax.grad(u_z)(jnp.asarray(z, jnp.float32)), np.float64)
        g = np.asarray(jax.grad(u)(jnp.asarray(theta, jnp.float32)), np.float64)
        np.testing.assert_allclose(g_z, lower.T @ g, rtol=1e-4, atol=1e-4 * np.abs(g).max())
    x_test = rng.normal(size=(5, d)).astype(np.float32)
    z = jnp.asarray(rng.normal(size=d), jnp.float32)
    np.testing.assert_allclose(model_z.predict(z, x_test), model.predict(jnp.asarray(w.to_theta(np.asarray(z))), x_test),
                               rtol=1e-5, atol=1e-5)
    assert model_z.name == "linear-regression-whitened" and model_z.layout is None and model_z.dim == d


@pytest.mark.parametrize("kind", ["full", "diagonal"])
def test_the_maps_of_draws_are_each_others_inverses(kind):
    rng = np.random.default_rng(1)
    d = 5
    w = Whitening(rng.normal(size=d), _factors(d, rng)[kind])
    theta = rng.normal(size=(2, 7, d))  # [chain, draw, d]
    np.testing.assert_allclose(w.to_theta(w.to_z(theta)), theta, rtol=1e-12, atol=1e-12)
    z32 = rng.normal(size=(3, d)).astype(np.float32)
    assert w.to_theta(z32).dtype == np.float32 and w.to_z(z32).dtype == np.float32
    assert w.full == (kind == "full")


def test_shapes_that_do_not_fit_are_one_line():
    model = linear_regression(3)
    with pytest.raises(ValueError, match=r"centre of shape \(3,\) and a factor of shape \(3, 3\) or \(3,\)") as err:
        whitened(model, np.zeros(3), np.eye(2))
    assert "\n" not in str(err.value)
