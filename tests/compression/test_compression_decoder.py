"""Tests for fedmcmc.compression's QSGD decoder on malformed input: every defect raises
ValueError, and no input, however damaged, decodes to a vector of the wrong size.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedmcmc.compression._bits import BitWriter, elias_omega_encode
from fedmcmc.compression._qsgd_codec import decode_qsgd, encode_qsgd


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
