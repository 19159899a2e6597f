"""A runtime message as Flower records and back (``fedmcmc.app.flower.content``): every array and
wire encoding in one ``uint8`` array, read back bit for bit."""

import numpy as np
import pytest

from fedmcmc.app.flower.content import ARRAYS, from_content, to_content


def test_arrays_and_wire_bytes_travel_in_one_array_bit_for_bit():
    rng = np.random.default_rng(0)
    message = {"kind": "round", "k": 7, "bits": [1.5, 2],
               "broadcast": [rng.normal(size=(3, 4)).astype(np.float32), rng.normal(size=(2,)),
                             np.array(np.nan), np.zeros((0, 5), np.int32)],
               "masks": [rng.random((8, 3)) < 0.5],
               "upload": b"\x00\xffcode", "anchor": b""}
    content = to_content(message)
    assert list(content[ARRAYS].keys()) == ["data"] and content[ARRAYS]["data"].dtype == "uint8"
    back = from_content(content)
    assert back.keys() == message.keys()
    for name in ("broadcast", "masks"):
        assert len(back[name]) == len(message[name])
        for got, sent in zip(back[name], message[name]):
            assert got.dtype == sent.dtype and got.shape == sent.shape and got.tobytes() == sent.tobytes()
            assert got.flags.writeable
    assert back["upload"] == b"\x00\xffcode" and back["anchor"] == b""
    assert back["k"] == 7 and back["bits"] == [1.5, 2]


def test_an_array_without_a_numpy_type_string_is_refused():
    with pytest.raises(TypeError, match="no NumPy type string"):
        to_content({"broadcast": [np.zeros(2, dtype=[("a", "f4")])]})


def test_a_message_without_arrays_carries_an_empty_array_record():
    content = to_content({"kind": "hello", "n": 3})
    assert len(content[ARRAYS]) == 0 and from_content(content) == {"kind": "hello", "n": 3}
