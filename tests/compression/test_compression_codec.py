"""Tests for fedmcmc.compression's wire formats: the QSGD code (round trips, exact bit counts
in JAX against the encoder and a pure-Python reference, mode choice, layout, the range of
``s``), Elias-omega codes and the bit buffers. Malformed input: test_compression_decoder.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
from fedmcmc.compression.quantization import quantize

_bits_jit = jax.jit(qsgd_encoded_bits)  # s (if any) traced
_bits_static = jax.jit(qsgd_encoded_bits, static_argnums=1)  # s a Python int
_quantize_jit = jax.jit(quantize)

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_codec_roundtrip_random_levels_and_batched_bit_count():
    rng = np.random.default_rng(11)
    batches = {}  # d -> (levels, s): d = 50 takes the unrolled gap loop, d = 200 the blocks
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


@pytest.mark.slow
def test_sparse_body_of_long_vectors_across_blocks():
    """Long vectors (the blocked gap count): nonzeros at block edges (multiples of 16 and
    their neighbours), runs, and gaps spanning many blocks, up to gaps of 2**17 whose
    Elias-omega codes have the longest groups (d not a multiple of the block)."""
    d = 2**17 + 37
    edges = [0, 1, 15, 16, 17, 31, 32, 47, 48, 63, 64, 65, 255, 256, 4096, 65535, 65536]
    patterns = [edges, [d - 1], [0, d - 1], [2**17 + 5], list(range(100, 140)) + [d - 2], []]
    rng = np.random.default_rng(5)
    patterns += [sorted(rng.choice(d, size=k, replace=False).tolist()) for k in (3, 50, 2000)]
    levels = np.zeros((len(patterns), d), np.int32)
    for row, where in zip(levels, patterns):
        row[where] = rng.integers(1, 300, size=len(where)) * rng.choice([-1, 1], size=len(where))
    sparse, _ = map(np.asarray, jax.jit(elias_body_bits)(jnp.asarray(levels)))
    np.testing.assert_array_equal(sparse, [_reference_bits(x)["sparse"] - HEADER for x in levels])


@pytest.mark.slow
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
