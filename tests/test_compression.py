"""Tests for fedmcmc.compression: quantiser statistics, exact bit accounting, wire codec.

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
from fedmcmc.compression._bits import (
    BitReader,
    BitWriter,
    elias_omega_code,
    elias_omega_decode,
    elias_omega_encode,
    elias_omega_length,
)
from fedmcmc.compression._qsgd_bits import elias_body_bits, qsgd_encoded_bits
from fedmcmc.compression._qsgd_codec import decode_qsgd, encode_qsgd
from fedmcmc.compression.quantization import dequantize, dequantize_np, quantize

N_MC = 20_000
Z = 5.0  # number of standard errors allowed in Monte-Carlo checks
EPS32 = float(np.finfo(np.float32).eps)
_bits_jit = jax.jit(qsgd_encoded_bits)  # s (if any) traced
_bits_static = jax.jit(qsgd_encoded_bits, static_argnums=1)  # s a Python int
_quantize_jit = jax.jit(quantize)


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


HEADER = 2 + 32  # mode bits + float32 norm
MODES = {"sparse": 0b00, "dense": 0b01, "fixed": 0b10}


def _reference_bits(levels, s=None) -> dict[str, int]:
    """Unpadded message length of each body, computed directly from the format spec in
    pure Python (independent of the JAX code): {"sparse", "dense"[, "fixed"]}."""
    levels = [int(x) for x in np.asarray(levels)]
    om = lambda n: len(elias_omega_code(n))  # noqa: E731
    sparse, prev = HEADER + om(sum(x != 0 for x in levels) + 1), -1
    for i, x in enumerate(levels):
        if x:
            sparse += om(i - prev) + 1 + om(abs(x))
            prev = i
    dense = HEADER + sum(om(abs(x) + 1) + (x != 0) for x in levels)
    bits = {"sparse": sparse, "dense": dense}
    if s is not None:
        bits["fixed"] = HEADER + len(levels) * (1 + len(format(int(s), "b")))
    return bits


def _expected_mode(bits: dict[str, int]) -> int:
    """Mode the encoder must choose: the shortest body, ties to sparse, dense, fixed."""
    for name in ("sparse", "dense", "fixed"):
        if name in bits and bits[name] == min(bits.values()):
            return MODES[name]
    raise AssertionError(bits)


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
        assert MODES["fixed"] in modes


# --------------------------------------------------------------------------------------
# Wire codec
# --------------------------------------------------------------------------------------


def _check_roundtrip(norm, levels, s=None):
    """Encode (with ``s`` if given), decode, and check the bit count three ways: the
    encoder's, qsgd_encoded_bits' (s static and traced) and the pure-Python reference."""
    levels = np.asarray(levels, dtype=np.int32)
    data, nbits = encode_qsgd(norm, levels, s, return_bits=True)
    norm2, levels2 = decode_qsgd(data, levels.size, s=s)
    assert isinstance(norm2, np.float32) and levels2.dtype == np.int32
    assert np.float32(norm).view(np.uint32) == norm2.view(np.uint32)
    np.testing.assert_array_equal(levels2, levels)
    if s is None:
        assert int(_bits_jit(jnp.asarray(levels))) == nbits
    else:
        assert int(_bits_jit(jnp.asarray(levels), jnp.int32(s))) == nbits  # s traced
    assert 0 <= 8 * len(data) - nbits <= 7
    reference = _reference_bits(levels, s)
    assert nbits == min(reference.values())
    mode = data[0] >> 6
    assert mode == _expected_mode(reference)
    return mode


def test_codec_roundtrip_quantized_vectors():
    rng = np.random.default_rng(7)
    modes, modes_without_s = set(), set()
    for d in (1, 2, 7, 50, 64, 65, 333, 1500):
        for s in (1, 2, 16, 2**16):
            for trial in range(3):
                kind = trial % 3
                if kind == 0:
                    v = rng.standard_normal(d)
                elif kind == 1:
                    v = rng.standard_cauchy(d)  # heavy tails: sparse levels
                else:
                    v = rng.standard_normal(d) * (rng.random(d) < 0.1)
                key = jax.random.key(int(rng.integers(2**31)))
                norm, levels = _quantize_jit(key, v.astype(np.float32), s)
                modes.add(_check_roundtrip(norm, levels, s=s))
                modes_without_s.add(_check_roundtrip(norm, levels))
    assert modes == {0b00, 0b01, 0b10}  # sparse, dense and fixed-width were exercised
    assert modes_without_s == {0b00, 0b01}  # without s: never fixed-width


def test_codec_roundtrip_random_levels_and_batched_bit_count():
    rng = np.random.default_rng(11)
    batches = {}  # d -> (levels, s): d = 50 takes the unrolled gap loop, d = 200 the scan
    for d in (200, 50, 64, 65, 3):
        for density in (0.0, 0.01, 0.3, 1.0):
            for s in (1, 2, 3, 4, 5, 2**16, 2**24, 2**31 - 2):
                levels = rng.integers(-s, s + 1, size=d) * (rng.random(d) < density)
                levels = levels.astype(np.int32)
                _check_roundtrip(float(rng.exponential()), levels)
                _check_roundtrip(float(rng.exponential()), levels, s)
                batches.setdefault(d, ([], []))
                batches[d][0].append(levels)
                batches[d][1].append(s)
    for d in (200, 50):
        batch, ss = np.stack(batches[d][0]), np.asarray(batches[d][1], np.int32)
        expected = [min(_reference_bits(b).values()) for b in batch]
        expected_s = [min(_reference_bits(b, s).values()) for b, s in zip(batch, ss)]
        counted = np.asarray(jax.jit(jax.vmap(qsgd_encoded_bits))(jnp.asarray(batch)))
        np.testing.assert_array_equal(counted, expected)
        np.testing.assert_array_equal(np.asarray(_bits_jit(jnp.asarray(batch))), counted)
        # s batched under vmap, s as a batch array, and s shared (in_axes=None)
        counted_s = jax.jit(jax.vmap(qsgd_encoded_bits))(jnp.asarray(batch), jnp.asarray(ss))
        np.testing.assert_array_equal(np.asarray(counted_s), expected_s)
        batched_s = _bits_jit(jnp.asarray(batch), jnp.asarray(ss))
        np.testing.assert_array_equal(np.asarray(batched_s), expected_s)
        shared = jax.jit(jax.vmap(qsgd_encoded_bits, in_axes=(0, None)))(batch, 2**31 - 2)
        np.testing.assert_array_equal(
            np.asarray(shared), [min(_reference_bits(b, 2**31 - 2).values()) for b in batch]
        )


@pytest.mark.parametrize("d", [1, 2, 7, 50, 64, 65, 200])
def test_each_body_length_matches_reference(d):
    """The sparse and dense body lengths separately (not only their minimum, which would
    hide errors in the body that is not chosen), on vectors of every density."""
    rng = np.random.default_rng(d)
    n = 400
    density = rng.choice([0.0, 0.02, 0.05, 0.1, 0.3, 0.7, 1.0], size=(n, 1))
    s = rng.choice([1, 3, 16, 2**16, 2**31 - 2], size=(n, 1))
    levels = (rng.integers(-(2**31 - 2), 2**31 - 1, size=(n, d)) % (s + 1)) * np.where(
        rng.random((n, d)) < 0.5, -1, 1
    )
    levels = (levels * (rng.random((n, d)) < density)).astype(np.int32)
    sparse, dense = map(np.asarray, jax.jit(elias_body_bits)(jnp.asarray(levels)))
    reference = [_reference_bits(x) for x in levels]
    np.testing.assert_array_equal(sparse, [r["sparse"] - HEADER for r in reference])
    np.testing.assert_array_equal(dense, [r["dense"] - HEADER for r in reference])


def test_codec_exhaustive_small_vectors_and_ties():
    """Every level vector of length <= 3 for s in 1..4: bit count and mode (including
    every kind of tie) match the reference."""
    ties = set()
    for s in (1, 2, 3, 4):
        for d in (0, 1, 2, 3):
            grid = np.array(np.meshgrid(*[np.arange(-s, s + 1)] * d, indexing="ij"))
            vectors = grid.reshape(d, -1).T.astype(np.int32) if d else np.zeros((1, 0), np.int32)
            counted = np.asarray(_bits_static(jnp.asarray(vectors), s))
            counted_traced = np.asarray(_bits_jit(jnp.asarray(vectors), jnp.int32(s)))
            for levels, n, n_traced in zip(vectors, counted, counted_traced):
                reference = _reference_bits(levels, s)
                data, nbits = encode_qsgd(0.5, levels, s, return_bits=True)
                assert nbits == n == n_traced == min(reference.values())
                assert data[0] >> 6 == _expected_mode(reference)
                shortest = frozenset(k for k, v in reference.items() if v == nbits)
                if len(shortest) > 1:
                    ties.add(shortest)
                np.testing.assert_array_equal(decode_qsgd(data, d, s=s)[1], levels)
    assert {frozenset({"sparse", "dense"}), frozenset({"dense", "fixed"}),
            frozenset({"sparse", "dense", "fixed"})} <= ties
    # sparse == fixed < dense first happens for d = 5: (sparse, dense, fixed) = 34 + (15, 17, 15)
    levels = np.array([0, 0, 3, -3, 0], np.int32)
    assert _reference_bits(levels, 3) == {"sparse": 49, "dense": 51, "fixed": 49}
    assert _check_roundtrip(1.0, levels, 3) == MODES["sparse"]
    # all three tie: sparse wins; d = 0: dense and fixed tie (0 bits), dense wins
    assert _reference_bits([1, 0, 0], 1) == {"sparse": 40, "dense": 40, "fixed": 40}
    assert _check_roundtrip(1.0, [1, 0, 0], 1) == MODES["sparse"]
    assert _check_roundtrip(1.0, np.zeros(0, np.int32), 1) == MODES["dense"]


def test_fixed_width_message_layout():
    s = 2**16
    levels = np.array([s, -40000, 30000, 12345, -(s - 1)], np.int32)
    data, nbits = encode_qsgd(3.0, levels, s, return_bits=True)
    body = "".join(("1" if x < 0 else "0") + format(abs(x), "017b") for x in levels)
    norm = format(int(np.float32(3.0).view(np.uint32)), "032b")
    bits = "10" + norm + body
    assert nbits == len(bits) == 2 + 32 + 5 * 18
    assert data == int(bits + "0" * (-len(bits) % 8), 2).to_bytes(len(data), "big")
    norm2, levels2 = decode_qsgd(data, 5, s=s)
    assert norm2 == 3.0
    np.testing.assert_array_equal(levels2, levels)
    assert int(qsgd_encoded_bits(levels, s)) == nbits
    # without s the same levels are Elias coded, and the message is longer
    data_elias, nbits_elias = encode_qsgd(3.0, levels, return_bits=True)
    assert data_elias[0] >> 6 == 0b01 and nbits_elias > nbits
    assert int(qsgd_encoded_bits(levels)) == nbits_elias
    # s = 1: 2 bits per coordinate
    levels = np.array([1, -1, 0, 1, 1, -1], np.int32)
    data, nbits = encode_qsgd(1.0, levels, 1, return_bits=True)
    assert data[0] >> 6 == 0b10 and nbits == 34 + 12
    assert (int.from_bytes(data, "big") >> (8 * len(data) - nbits)) & 0xFFF == 0b01_11_00_01_01_11


@pytest.mark.parametrize("s", [None, 1, 2, 3, 4, 2**16, 2**24])
@pytest.mark.parametrize(
    "levels",
    [
        np.zeros(10),
        np.array([0] * 9 + [1]),
        np.array([-1] + [0] * 9),
        np.array([1, -1, 1, -1, 0, 0, 1, -1]),
        np.array([0] * 63 + [1]),
        np.array([1] + [0] * 64),
        np.array([-1]),
        np.array([0]),
        np.array([], dtype=np.int32),
    ],
    ids=["zeros", "last", "first", "mixed", "last-of-64", "first-of-65", "d1", "d1-zero", "d0"],
)
def test_codec_edge_cases(levels, s):
    _check_roundtrip(1.5, levels.astype(np.int32), s)


@pytest.mark.parametrize(
    "levels",
    [
        np.array([1, -1, 2, -2, 3, -3, 4, -4]),
        np.full(17, -(2**16)),
        np.array([0] * 5 + [2**16] + [0] * 5),
        np.array([2**31 - 2, -(2**31 - 2), 0]),
        np.array([5]),
    ],
    ids=["all-nonzero", "all-max", "single-large", "int32-extreme", "d1"],
)
def test_codec_edge_cases_large_levels(levels):
    s_max = int(np.max(np.abs(levels)))
    for s in (None, s_max, 2**24, 2**31 - 2, 2**31 - 1):
        if s is None or s >= s_max:
            _check_roundtrip(1.5, levels.astype(np.int32), s)


def test_bit_count_static_and_traced_s_agree():
    """A Python-int s (constant folded) and a traced int32 s give the same count, for s
    around every power of two; the fixed body is d (1 + bitlength(s))."""
    levels = np.array([1, 0, -1], np.int32)
    s_values = sorted({1, 2, 3} | {2**k + o for k in range(2, 31) for o in (-1, 0, 1)})
    s_values = [s for s in s_values if s <= 2**31 - 1]
    over_s = jax.jit(jax.vmap(qsgd_encoded_bits, in_axes=(None, 0)))
    traced = np.asarray(over_s(levels, np.asarray(s_values, np.int32)))
    dense = min(_reference_bits(levels).values())
    for s, n in zip(s_values, traced):
        expected = min(dense, HEADER + 3 * (1 + s.bit_length()))
        assert int(qsgd_encoded_bits(levels, s)) == n == expected, s  # eager, s static
    zeros = np.zeros(4, np.int32)  # sparse body: 1 bit, beats every fixed body
    assert int(qsgd_encoded_bits(zeros, 2**31 - 1)) == HEADER + 1


def test_codec_s_validation():
    levels = np.array([0, 3, -2], np.int32)
    with pytest.raises(ValueError, match="<= s = 2"):
        encode_qsgd(1.0, levels, 2)
    for bad in (0, -1, 2**31, True, 2.5, "4"):
        with pytest.raises(ValueError, match="number of levels"):
            encode_qsgd(1.0, levels, bad)
        with pytest.raises(ValueError, match="number of levels"):
            decode_qsgd(encode_qsgd(1.0, levels), 3, s=bad)
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="number of levels"):
            qsgd_encoded_bits(levels, bad)
    with pytest.raises(TypeError):
        qsgd_encoded_bits(levels, jnp.float32(4.0))
    # numpy / JAX integer scalars are accepted
    for s in (np.int32(3), np.int64(3), jnp.int32(3)):
        data, nbits = encode_qsgd(1.0, levels, s, return_bits=True)
        assert nbits == int(qsgd_encoded_bits(levels, s))
        np.testing.assert_array_equal(decode_qsgd(data, 3, s=s)[1], levels)


def test_codec_preserves_special_norms():
    for norm in (0.0, np.finfo(np.float32).tiny / 8, np.finfo(np.float32).max, np.inf):
        _check_roundtrip(norm, np.array([0, 1, -1, 0], np.int32))
        assert _check_roundtrip(norm, np.array([1, 1, -1, 1], np.int32), 1) == 0b10
    negative_nan = np.array(0xFFC00001, np.uint32).view(np.float32)
    norm, _ = decode_qsgd(encode_qsgd(negative_nan, np.zeros(3, np.int32)), 3)
    assert np.isnan(norm)
    norm, _ = decode_qsgd(encode_qsgd(-0.0, np.zeros(3, np.int32)), 3)
    assert norm == 0 and not np.signbit(norm)


def test_elias_omega_length_matches_encoder():
    ns = list(range(1, 5001))
    ns += [2**k + o for k in range(12, 31) for o in (-1, 0, 1)] + [2**31 - 1, 123456789]
    lengths = np.asarray(elias_omega_length(jnp.asarray(ns, dtype=jnp.int32)))
    expected = [len(elias_omega_code(n)) for n in ns]
    np.testing.assert_array_equal(lengths, expected)
    assert elias_omega_code(1) == "0" and elias_omega_code(2) == "100"
    assert elias_omega_code(17) == "10100100010"

    writer = BitWriter()
    for n in ns:
        elias_omega_encode(writer, n)
    assert len(writer) == sum(expected)
    reader = BitReader(writer.to_bytes())
    assert [elias_omega_decode(reader) for _ in ns] == ns
    assert reader.remaining < 8


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


def _message(mode: int, norm_bits: int, codes: list[int], pad_ones: bool = False) -> bytes:
    """Header (2 mode bits, 32 norm bits), then Elias-omega codes (ints) or raw bits (str)."""
    w = BitWriter()
    w.write_bits(mode, 2)
    w.write_bits(norm_bits, 32)
    for item in codes:
        if isinstance(item, str):
            w.write_code(item)
        else:
            elias_omega_encode(w, item)
    if pad_ones:
        while len(w) % 8:
            w.write_bit(1)
    return w.to_bytes()


def test_decoder_rejects_malformed_messages():
    one = int(np.float32(1.0).view(np.uint32))
    levels = np.array([0, 3, 0, 0, -1, 0, 0, 0, 2, 0], np.int32)
    good = encode_qsgd(1.0, levels)
    cases = {
        "truncated": good[:-1],
        "empty": b"",
        "header only": good[:3],
        "trailing byte": good + b"\x00",
        "wrong d": good,  # decoded with d = 5 below
        "negative norm": _message(0, int(np.float32(-1.0).view(np.uint32)), [1]),
        "too many nonzeros": _message(0, one, [12]),  # nnz = 11 > d = 10
        # first nonzero at index 9 (gap + 1 = 10), then a gap pointing past the end
        "index past d": _message(0, one, [3, 10, "0", 1, 2, "0", 1]),
        "nonzero padding": _message(0, one, [1], pad_ones=True),
        "huge level": _message(1, one, ["1" * 70]),
        "level above s": _message(0, one, [2, 1, "0", 17]),
        "invalid mode 11": _message(0b11, one, [1]),
        "fixed-width without s": _message(0b10, one, ["0000"] * 10),
    }
    assert decode_qsgd(_message(0, one, [2, 10, "0", 1]), 10)[1][9] == 1  # the valid prefix
    for name, data in cases.items():
        _assert_rejected(name, data, 5 if name == "wrong d" else 10, 16 if name == "level above s" else None)
    with pytest.raises(ValueError, match="dimension"):
        decode_qsgd(good, -1)
    with pytest.raises(ValueError, match="non-negative"):
        encode_qsgd(-1.0, levels)
    with pytest.raises(ValueError, match="1-D"):
        encode_qsgd(1.0, levels.reshape(2, 5))


def _assert_rejected(name, data, d, s):
    """``decode_qsgd`` must raise ValueError on a malformed message."""
    with pytest.raises(ValueError):
        decode_qsgd(data, d, s=s)
        pytest.fail(f"malformed message accepted: {name}")  # pragma: no cover


def test_decoder_rejects_malformed_fixed_width_messages():
    one = int(np.float32(1.0).view(np.uint32))
    s, d = 5, 4  # width 3: sign bit + 3 magnitude bits per coordinate
    levels = np.array([5, 0, -3, 1], np.int32)
    good = encode_qsgd(1.0, levels, s)
    assert good[0] >> 6 == 0b10
    assert good == _message(0b10, one, ["0101", "0000", "1011", "0001"])
    np.testing.assert_array_equal(decode_qsgd(good, d, s=s)[1], levels)
    with pytest.raises(
        ValueError, match=r"^fixed-width QSGD message: pass s, the number of levels, to decode it$"
    ):
        decode_qsgd(good, d)
    with pytest.raises(ValueError, match="invalid mode"):
        decode_qsgd(_message(0b11, one, ["0000"] * d), d, s=s)
    cases = {
        "truncated": good[:-1],
        "truncated in the header": good[:2],
        "mode bits only": bytes([0b10000000]),
        "trailing byte": good + b"\x00",
        "level above s": _message(0b10, one, ["0110", "0000", "0000", "0000"]),  # 6 > 5
        "negative zero": _message(0b10, one, ["0001", "1000", "0000", "0000"]),
        "nonzero padding": _message(0b10, one, ["0001"] * d, pad_ones=True),
        "one coordinate short": _message(0b10, one, ["0001"] * (d - 1)),
    }
    for name, data in cases.items():
        _assert_rejected(name, data, d, s)
    with pytest.raises(ValueError, match="truncated"):
        decode_qsgd(good[:-1], d, s=s)
    with pytest.raises(ValueError):
        decode_qsgd(good, d - 1, s=s)  # wrong d: trailing bits
    with pytest.raises(ValueError):
        decode_qsgd(good, d + 2, s=s)  # wrong d: truncated (d + 1 fits in the padding)


def test_decoder_fuzz_never_returns_wrong_size():
    rng = np.random.default_rng(123)
    good = encode_qsgd(2.0, np.array([0, 1, -4, 0, 0, 7, 0, 0], np.int32))
    good_fixed = encode_qsgd(2.0, np.array([1, -2, 3, -1, 0, 3, 2, 1], np.int32), 3)
    assert good_fixed[0] >> 6 == 0b10
    for trial in range(4000):
        s = [None, 1, 3, 7][trial % 4]
        if trial % 2:
            data = rng.integers(0, 256, size=int(rng.integers(0, 24)), dtype=np.uint8).tobytes()
        else:  # flip a few bits of a valid message
            arr = np.frombuffer(good if trial % 4 == 0 else good_fixed, np.uint8).copy()
            pos = rng.integers(0, 8 * len(arr), size=int(rng.integers(1, 4)))
            arr[pos // 8] ^= (1 << (7 - pos % 8)).astype(np.uint8)
            data = arr.tobytes()
        d = int(rng.integers(0, 12))
        try:
            norm, levels = decode_qsgd(data, d, s=s)
        except ValueError:
            continue
        assert isinstance(norm, np.float32) and levels.shape == (d,) and levels.dtype == np.int32
        if s is not None:
            assert np.all(np.abs(levels) <= s)
        # Anything accepted re-encodes (with the same s) to a message no longer than it,
        # the same one unless the message used a longer mode.
        again = encode_qsgd(norm, levels, s)
        assert len(again) <= len(data)
