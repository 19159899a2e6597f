"""Clipping: the decoded upload's norm is at most the bound, exactly (QSGD's decoding may be
longer than its input), on a fixed-point grid too (its rounding may lengthen an upload), the
message format and bits are the inner compressor's, and per-record
gradient clipping bounds each record's gradient and leaves values alone."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedmcmc.compression import clipped, fixed_point, identity, quantization, resolve_clipped
from fedmcmc.compression.fixed_point import grid_clip
from fedmcmc.compression.quantization import dequantize_np
from fedmcmc.estimators.gradients import weighted_potential_grad
from fedmcmc.models import clipped_gradients, logistic_regression


def decoded_norms(compressor, vectors, key=0):
    keys = jax.random.split(jax.random.key(key), len(vectors))
    state = compressor.init(vectors[0])
    messages, _, info = jax.jit(jax.vmap(compressor.apply, (0, 0, None)))(keys, vectors, state)
    decoded = jax.jit(jax.vmap(compressor.decode))(messages)
    return messages, info, np.linalg.norm(np.asarray(decoded, np.float64), axis=1)


@pytest.mark.slow
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


def test_the_clip_holds_for_the_grid_values_the_server_sums():
    """Inside a fixed_point grid (coarse, 2^-4, so rounding matters) the clip lowered by
    sqrt(d) 2^-(p+1) bounds the grid value's norm over random uploads and adversarial ones (every
    coordinate just above a half step, so it rounds up), where the unlowered clip does not; and
    rounding does lengthen an upload by nearly the whole margin, so no smaller margin holds."""
    d, p, bound = 16, 4, 1.0
    margin, safe_clip = np.sqrt(d) * 2.0**-(p + 1), grid_clip(bound, p, d)
    assert safe_clip == bound - margin
    rng = np.random.default_rng(4)
    ks = np.concatenate([rng.integers(0, 6, (4000, d)), np.repeat(np.arange(3)[:, None], d, axis=1)])
    halves = (ks + 0.5 + 1e-3) * 2.0**-p * rng.choice([-1, 1], ks.shape)
    halves = halves[np.linalg.norm(halves, axis=1) < safe_clip * (1 - 2**-15)]  # unclipped: they round up
    random = rng.normal(size=(400, d)) * np.linspace(0.05, 1, 400)[:, None]
    v = np.concatenate([halves, halves * (bound / np.linalg.norm(halves, axis=1, keepdims=True)), random])
    v = jnp.asarray(v, jnp.float32)
    spec = {"fixed_point": {"fraction_bits": p, "max_abs": 4.0}}
    naive = decoded_norms(fixed_point(clipped(identity(), bound), p, 4.0), v)[2]
    assert naive.max() > bound + margin / 2  # the grid lengthens uploads clipped at the bound
    safe = decoded_norms(resolve_clipped(spec, bound, d), v)[2]
    assert safe.max() <= bound and safe.max() > bound - margin
    lengthened = safe[:len(halves)] - np.linalg.norm(np.asarray(v[:len(halves)], np.float64), axis=1)
    assert lengthened.max() > 0.99 * margin
    assert decoded_norms(resolve_clipped({"bits": 2, **spec}, bound, d), v)[2].max() <= bound
    with pytest.raises(ValueError, match="raise fixed_point fraction_bits"):
        resolve_clipped(spec, 0.99 * margin, d)
