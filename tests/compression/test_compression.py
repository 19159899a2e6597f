"""Tests for fedmcmc.compression's compressors: quantiser statistics, their messages through
the codec face, per-client levels, configuration values. The bit formats are tested in
test_compression_codec.py and test_compression_decoder.py.

Statistical checks use fixed seeds and tolerances of 5 Monte-Carlo standard errors.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fedmcmc.compression import decode, encode, identity, qsgd_bits_bound, quantization, resolve_compressor
from fedmcmc.compression._qsgd_codec import MODE_FIXED, decode_qsgd, encode_qsgd
from fedmcmc.compression.quantization import dequantize, dequantize_np, quantize

N_MC = 20_000
Z = 5.0  # number of standard errors allowed in Monte-Carlo checks
EPS32 = float(np.finfo(np.float32).eps)


def _test_vector(d: int = 50) -> np.ndarray:
    """Fixed float32 vector with magnitudes spread over two decades and mixed signs."""
    rng = np.random.default_rng(20220328)
    mags = np.geomspace(0.02, 2.0, d)
    signs = rng.choice([-1.0, 1.0], size=d)
    return (rng.permutation(mags) * signs).astype(np.float32)


def roundtrip(compressor, key, v, state):
    """``apply`` then the receiver's ``decode``: ``(v_hat, state, info)``."""
    message, state, info = compressor.apply(key, v, state)
    return compressor.decode(message), state, info


def _mc_samples(compressor, v, n=N_MC, seed=0):
    """n independent compressions of v (vmap over keys, jitted) as float64 numpy."""
    state = compressor.init(jnp.asarray(v))
    keys = jax.random.split(jax.random.key(seed), n)
    apply = jax.jit(jax.vmap(lambda k, x, st: roundtrip(compressor, k, x, st), in_axes=(0, None, None)))
    v_hat, _, info = apply(keys, jnp.asarray(v), state)
    return np.asarray(v_hat, dtype=np.float64), np.asarray(info.bits)


def _fractional_parts(v, s):
    v64 = np.asarray(v, dtype=np.float64)
    norm = np.linalg.norm(v64)
    r = s * np.abs(v64) / norm
    return norm, r - np.floor(r)


# --------------------------------------------------------------------------------------
# Quantiser statistics
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("s", [1, 4, 16])
def test_quantization_is_unbiased(s):
    v = _test_vector()
    norm, frac = _fractional_parts(v, s)
    # Precondition: every coordinate's Bernoulli has >= 50 expected events of each kind,
    # so that the sample variance is a reliable standard-error estimate.
    assert np.min(N_MC * np.minimum(frac, 1 - frac)) >= 50

    samples, _ = _mc_samples(quantization(s), v, seed=s)
    mean = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / math.sqrt(N_MC)
    # float32 rounding of norm * l / s is a few ulps of ||v||; negligible next to se.
    rounding = 4 * EPS32 * norm
    assert np.all(np.abs(mean - v) <= Z * se + rounding), np.max(np.abs(mean - v) / se)

    # Aggregate check with the exact per-coordinate variance (norm/s)^2 f (1 - f).
    exact_se = (norm / s) * np.sqrt(frac * (1 - frac) / N_MC)
    chi2 = float(np.sum(((mean - v) / exact_se) ** 2))
    assert chi2 <= stats.chi2.ppf(1 - 1e-6, df=v.size)


@pytest.mark.parametrize("s", [1, 4, 16])
@pytest.mark.parametrize("kind", ["heterogeneous", "flat"])
def test_quantization_variance_bound(s, kind):
    v = _test_vector() if kind == "heterogeneous" else np.ones(50, np.float32)
    d = v.size
    compressor = quantization(s)
    samples, _ = _mc_samples(compressor, v, seed=100 + s)
    sq_err = np.sum((samples - v.astype(np.float64)) ** 2, axis=1)
    mse = sq_err.mean()
    se = sq_err.std(ddof=1) / math.sqrt(N_MC)
    norm2 = float(np.sum(v.astype(np.float64) ** 2))

    omega = compressor.omega(d)
    assert omega == pytest.approx(min(d / s**2, math.sqrt(d) / s))
    assert mse <= omega * norm2 + Z * se
    # The exact second moment (||v|| / s)^2 sum_i f_i (1 - f_i) is matched.
    norm, frac = _fractional_parts(v, s)
    exact = (norm / s) ** 2 * np.sum(frac * (1 - frac))
    assert abs(mse - exact) <= Z * se
    if s == 1:
        assert mse - Z * se > 0.1 * omega * norm2  # a genuinely noisy operator


def test_quantization_levels_bounded_and_zero_preserved():
    v = _test_vector().copy()
    v[7] = 0.0
    keys = jax.random.split(jax.random.key(3), 2000)
    for s in (1, 3, 2**16):
        norms, levels = jax.jit(jax.vmap(quantize, in_axes=(0, None, None)))(keys, v, s)
        levels = np.asarray(levels)
        assert levels.dtype == np.int32
        assert np.all(np.abs(levels) <= s)
        assert np.all(levels[:, 7] == 0)
        nz = levels != 0
        assert np.all(np.sign(levels[nz]) == np.broadcast_to(np.sign(v), levels.shape)[nz])
        np.testing.assert_allclose(np.asarray(norms), np.linalg.norm(v), rtol=1e-6)


@pytest.mark.slow
def test_quantize_non_finite_input_gives_nan_and_zero_levels():
    c = quantization(16)
    for bad in (np.inf, -np.inf, np.nan):
        v = _test_vector().copy()
        v[3] = bad
        norm, levels = quantize(jax.random.key(0), v, 16)
        assert not np.isfinite(norm) and np.all(np.asarray(levels) == 0)
        v_hat, _, info = jax.jit(lambda *a: roundtrip(c, *a))(jax.random.key(0), jnp.asarray(v), c.init(v))
        assert np.all(np.isnan(np.asarray(v_hat))) and int(info.bits) == 2 + 32 + 1
        for s in (None, 16):
            data, nbits = encode_qsgd(norm, levels, s, return_bits=True)
            norm2, levels2 = decode_qsgd(data, v.size, s=s)
            assert nbits == 35 and np.isnan(norm2) and np.all(levels2 == 0)
        assert np.all(np.isnan(dequantize_np(norm2, levels2, 16)))


def test_quantize_norm_survives_tiny_and_huge_inputs():
    for scale in (1e-30, 1e30):
        v = scale * _test_vector()
        norm, levels = quantize(jax.random.key(0), v, 16)
        assert np.isfinite(norm) and norm > 0
        np.testing.assert_allclose(float(norm), np.linalg.norm(v.astype(np.float64)), rtol=1e-5)
        assert np.any(np.asarray(levels) != 0)


def test_identity_is_exact_and_counts_32_bits_per_coordinate():
    c = identity()
    v = jnp.asarray(_test_vector())
    state = c.init(v, 3)
    assert state == ()
    message, state2, info = jax.jit(c.apply)(jax.random.key(0), v, state)
    np.testing.assert_array_equal(np.asarray(message), np.asarray(v))
    np.testing.assert_array_equal(np.asarray(c.decode(message)), np.asarray(v))
    assert state2 == ()
    assert info.bits.dtype == jnp.int32 and int(info.bits) == 32 * v.size
    assert c.omega(50) == 0.0 and c.name == "identity"
    enc = encode(message)
    assert enc.codec == "f32" and enc.bits == 8 * len(enc.data) == int(info.bits)
    got = decode(enc.codec, enc.data, v)
    assert got.bits == enc.bits
    np.testing.assert_array_equal(got.value, np.asarray(v))
    with pytest.raises(ValueError, match="dense message"):
        decode(enc.codec, enc.data[:-1], v)


def test_zero_vector_maps_to_zero_with_finite_bits():
    c = quantization(16)
    v = jnp.zeros(50, jnp.float32)
    v_hat, _, info = jax.jit(lambda *a: roundtrip(c, *a))(jax.random.key(0), v, c.init(v))
    assert np.all(np.asarray(v_hat) == 0) and np.all(np.isfinite(np.asarray(v_hat)))
    assert int(info.bits) == 2 + 32 + 1  # sparse mode, omega(0 + 1) = "0"
    norm, levels = quantize(jax.random.key(0), v, 16)
    data, nbits = encode_qsgd(norm, levels, 16, return_bits=True)
    assert nbits == int(info.bits) and len(data) == 5
    norm2, levels2 = decode_qsgd(data, 50)
    assert norm2 == 0 and np.all(levels2 == 0)


@pytest.mark.slow
@pytest.mark.parametrize("spec", [[1, 7, 2**16, 2**24], 7])
def test_apply_under_scan_and_double_vmap_matches_wire_format(spec):
    """apply inside lax.scan with vmap over chains and clients: the bits it reports are the
    encoder's length for its message, and the numpy decode of the encoded message reproduces
    the compressor's own decode bit for bit."""
    num_chains, d, steps = 2, 20, 4
    num_clients = len(spec) if isinstance(spec, list) else 3
    all_levels = spec if isinstance(spec, list) else [spec] * num_clients
    c = quantization(spec)
    v = jax.random.normal(jax.random.key(1), (num_chains, num_clients, d), jnp.float32)
    states = jax.vmap(lambda i: c.init(v[0, 0], i))(jnp.arange(num_clients))
    np.testing.assert_array_equal(np.asarray(states.levels), all_levels)
    apply = jax.vmap(jax.vmap(c.apply, in_axes=(0, 0, 0)), in_axes=(0, 0, None))

    def body(carry, key):
        keys = jax.random.split(key, num_chains * num_clients).reshape(num_chains, num_clients)
        message, _, info = apply(keys, carry, states)
        v_hat = jax.vmap(jax.vmap(c.decode))(message)
        return carry, (v_hat, info.bits, message)

    _, (v_hats, bits, messages) = jax.jit(
        lambda k: jax.lax.scan(body, v, jax.random.split(k, steps))
    )(jax.random.key(2))
    assert v_hats.shape == (steps, num_chains, num_clients, d) and bits.dtype == jnp.int32
    v_hats, bits, messages = jax.tree_util.tree_map(np.asarray, (v_hats, bits, messages))
    modes = set()
    for t in range(steps):
        for a in range(num_chains):
            for i, s in enumerate(all_levels):
                message = jax.tree_util.tree_map(lambda x: x[t, a, i], messages)
                enc = encode(message)
                assert enc.codec == f"qsgd/{s}" and enc.bits == bits[t, a, i]
                modes.add(enc.data[0] >> 6)
                got = decode(enc.codec, enc.data, message)
                np.testing.assert_array_equal(
                    got.value.view(np.uint32), v_hats[t, a, i].view(np.uint32)
                )
    assert got.bits == enc.bits
    assert all(np.array_equal(x, y) for x, y in zip(got.message, message))
    if isinstance(spec, list):  # s = 1 and s >= 2**16 send fixed-width messages
        assert MODE_FIXED in modes


def test_qsgd_bits_bound_by_hand():
    # s = 1 <= sqrt(100/2 - 10): (3 + 1.5 ln(202 / 11)) * 11 + 32 = 113.0211...
    assert qsgd_bits_bound(1, 100) == pytest.approx(113.0211, abs=1e-3)
    # s = sqrt(d): 2.8 * 100 + 32
    assert qsgd_bits_bound(10, 100) == pytest.approx(312.0)
    # s = 16 > sqrt(50/2 - sqrt 50): (0.5 (ln(1 + 306/50) + 1) + 2) * 50 + 32 = 206.0727...
    assert qsgd_bits_bound(16, 50) == pytest.approx(206.0727, abs=1e-3)
    # d < 4: the first branch is empty
    assert math.isfinite(qsgd_bits_bound(1, 2))


# --------------------------------------------------------------------------------------
# Per-client levels, numpy twin, configuration
# --------------------------------------------------------------------------------------


def test_per_client_levels():
    c = quantization([2, 16])
    v = jnp.zeros(50)
    assert int(c.init(v, 1).levels) == 16 and int(c.init(v, 0).levels) == 2
    assert c.init(v, 1).levels.dtype == jnp.int32
    traced = jax.jit(jax.vmap(lambda i: c.init(v, i).levels))(jnp.arange(2))
    np.testing.assert_array_equal(np.asarray(traced), [2, 16])
    omega = c.omega(50)
    assert isinstance(omega, np.ndarray) and omega.shape == (2,)
    np.testing.assert_allclose(omega, [min(50 / 4, math.sqrt(50) / 2), min(50 / 256, math.sqrt(50) / 16)])
    assert isinstance(quantization(16).omega(50), float)
    assert quantization(16).name == "qsgd-s16"
    for bad_index in (2, -1, jnp.int32(5)):
        with pytest.raises(ValueError, match="out of range"):
            c.init(v, bad_index)


def test_dequantize_numpy_twin_is_bit_identical():
    rng = np.random.default_rng(5)
    n, d = 64, 257
    norms = (rng.lognormal(0, 3, n) * rng.random(n)).astype(np.float32)
    ss = rng.choice([1, 3, 7, 16, 255, 2**16, 2**24], size=n).astype(np.int32)
    levels = np.stack([rng.integers(-s, s + 1, size=d) for s in ss]).astype(np.int32)
    jnp_out = np.asarray(jax.jit(jax.vmap(dequantize))(norms, levels, ss))
    eager = np.asarray(dequantize(norms[0], levels[0], int(ss[0])))
    for i in range(n):
        ref = dequantize_np(norms[i], levels[i], int(ss[i]))
        assert ref.dtype == np.float32
        np.testing.assert_array_equal(ref.view(np.uint32), jnp_out[i].view(np.uint32))
    np.testing.assert_array_equal(eager.view(np.uint32), jnp_out[0].view(np.uint32))
    # s as a compile-time constant and broadcast over a batch (in_axes=None)
    for s in (3, 7, 255):
        const = np.asarray(jax.jit(jax.vmap(lambda n, l: dequantize(n, l, s)))(norms, levels))
        shared = np.asarray(jax.jit(jax.vmap(dequantize, in_axes=(0, 0, None)))(norms, levels, s))
        ref = np.stack([dequantize_np(norms[i], levels[i], s) for i in range(n)])
        np.testing.assert_array_equal(const.view(np.uint32), ref.view(np.uint32))
        np.testing.assert_array_equal(shared.view(np.uint32), ref.view(np.uint32))


def test_resolve_compressor():
    for spec in (None, "none", "Identity", 0):
        assert resolve_compressor(spec).name == "identity"
    assert resolve_compressor(16).name == "qsgd-s16"
    assert resolve_compressor({"bits": 4}).name == "qsgd-s16"
    assert resolve_compressor({"bits": 0}).name == "qsgd-s1"
    assert resolve_compressor({"levels": 8}).name == "qsgd-s8"
    assert resolve_compressor({"levels": [2, 16]}).name == "qsgd-s[2,16]"
    c = quantization(4)
    assert resolve_compressor(c) is c
    for bad in ("qsgd", -1, 2.5, True, {"bits": 2.5}, {"bits": 40}, {"foo": 1},
                {"bits": 2, "levels": 4}, object()):
        with pytest.raises(ValueError):
            resolve_compressor(bad)


# --------------------------------------------------------------------------------------
# Bad inputs
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 2.5, "16", True, float("nan"), [2, 0], [], 2**24 + 1])
def test_quantization_rejects_bad_levels(bad):
    with pytest.raises(ValueError, match=r"quantization levels.*got") as err:
        quantization(bad)
    message = str(err.value)
    assert "2**" in message or "empty" in message


def test_quantization_error_message_names_value_and_fix():
    with pytest.raises(ValueError) as err:
        quantization(0)
    assert str(err.value) == (
        "quantization levels s must be an integer >= 1 (got 0); "
        "use s = 2**p for a p-bit quantiser"
    )
    with pytest.raises(ValueError, match=r"s\[1\].*got 2\.5"):
        quantization([4, 2.5])
    assert quantization(16.0).name == "qsgd-s16"  # integral floats are accepted
