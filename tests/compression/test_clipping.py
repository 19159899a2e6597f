"""Clipping: the decoded upload's norm is at most the bound, exactly (QSGD's decoding may be
longer than its input), the message format and bits are the inner compressor's, and per-record
gradient clipping bounds each record's gradient and leaves values alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.compression import clipped, identity, quantization
from fedmcmc.compression.quantization import dequantize_np
from fedmcmc.estimators.gradients import weighted_potential_grad
from fedmcmc.models import clipped_gradients, logistic_regression


def decoded_norms(compressor, vectors, key=0):
    keys = jax.random.split(jax.random.key(key), len(vectors))
    state = compressor.init(vectors[0])
    messages, _, info = jax.jit(jax.vmap(compressor.apply, (0, 0, None)))(keys, vectors, state)
    decoded = jax.jit(jax.vmap(compressor.decode))(messages)
    return messages, info, np.linalg.norm(np.asarray(decoded, np.float64), axis=1)


def test_qsgd_decodes_longer_than_its_input_and_the_clip_holds_on_the_decoded_message():
    d, bound = 64, 1.0
    v = jax.random.normal(jax.random.key(1), (500, d))
    v = v / jnp.linalg.norm(v, axis=1, keepdims=True) * bound  # inputs exactly at the bound
    inner_messages, inner_info, raw = decoded_norms(quantization(2), v)
    assert raw.max() > 1.5 * bound  # QSGD's decoding reaches (1 + sqrt(d) / s) ||v||
    messages, info, norms = decoded_norms(clipped(quantization(2), bound), v)
    assert norms.max() <= bound
    np.testing.assert_array_equal(messages.signed_levels, inner_messages.signed_levels)  # levels untouched
    np.testing.assert_array_equal(info.bits, inner_info.bits)
    m = jax.tree_util.tree_map(lambda a: a[0], messages)
    host = dequantize_np(m.norm, m.signed_levels, m.levels)  # the receiver's numpy decoding too
    assert np.linalg.norm(host.astype(np.float64)) <= bound


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_identity_clip_is_exact_and_leaves_short_vectors_alone(scale):
    v = jax.random.normal(jax.random.key(2), (200, 30)) * scale * jnp.linspace(0.01, 3, 200)[:, None]
    _, _, norms = decoded_norms(clipped(identity(), scale), v)
    assert norms.max() <= scale
    short = np.linalg.norm(np.asarray(v), axis=1) < scale * (1 - 1e-4)
    np.testing.assert_array_equal(np.asarray(decoded_norms(clipped(identity(), scale), v)[0])[short],
                                  np.asarray(v)[short])


def test_bad_bounds():
    for bad in (0.0, -1.0, float("inf"), True, "1"):
        with pytest.raises(ValueError, match="clipping bound must be a finite number > 0"):
            clipped(identity(), bad)
        with pytest.raises(ValueError, match="record clipping bound"):
            clipped_gradients(logistic_regression(2), bad)


def test_record_clipping_bounds_each_records_gradient_and_keeps_values():
    model = logistic_regression(3)
    x = jax.random.normal(jax.random.key(3), (40, 3)) * 4
    y = (x[:, 0] > 0).astype(jnp.int32)
    theta = jnp.array([-1.0, 2.0, 0.5])
    clip = clipped_gradients(model, 0.3)
    per_record = jax.vmap(jax.grad(clip.log_likelihood), (None, 0))(theta, (x, y))
    raw = jax.vmap(jax.grad(model.log_likelihood), (None, 0))(theta, (x, y))
    norms, raw_norms = np.linalg.norm(per_record, axis=1), np.linalg.norm(raw, axis=1)
    assert norms.max() <= 0.3 and raw_norms.max() > 0.3
    np.testing.assert_allclose(norms, np.minimum(raw_norms, 0.3 * (1 - 2**-16)), rtol=1e-5)
    weights = jnp.linspace(0.5, 2.0, 40)  # the estimators' one backward pass clips each record
    np.testing.assert_allclose(weighted_potential_grad(clip, theta, (x, y), weights),
                               -jnp.tensordot(weights, per_record, axes=1), rtol=1e-5, atol=1e-6)
    values = jax.vmap(clip.log_likelihood, (None, 0))(theta, (x, y))
    np.testing.assert_array_equal(values, jax.vmap(model.log_likelihood, (None, 0))(theta, (x, y)))
