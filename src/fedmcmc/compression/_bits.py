"""Bits on the host and their lengths in JAX: the bit buffer and the Elias-omega code.

Private to :mod:`fedmcmc.compression`: the wire formats (:mod:`._qsgd_codec`) write and read
with :class:`BitWriter` and :class:`BitReader`; :func:`elias_omega_length` counts in JAX the
bits :func:`elias_omega_code` writes on the host, so that a compressor reports its message's
exact length inside a jitted program.
"""

from __future__ import annotations

import functools
import operator

import jax.numpy as jnp
import numpy as np
from jax import lax

from fedmcmc.core.types import Array

#: Largest binary group the Elias-omega decoder accepts (guards against garbage input).
_MAX_OMEGA_GROUP_BITS = 63


def bitlength(n: Array) -> Array:
    """``bitlength(n) = ceil(log2(n + 1))`` of each entry of an int32 array ``n >= 0`` (JAX).

    The JAX twin of Python's ``int.bit_length``.
    """
    return 32 - lax.clz(jnp.asarray(n).astype(jnp.int32))


class BitWriter:
    """Append-only bit buffer, most significant bit first within each byte.

    Examples
    --------
    >>> w = BitWriter()
    >>> w.write_bit(1); w.write_bits(5, 3)
    >>> len(w), w.to_bytes()
    (4, b'\\xd0')
    """

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._length = 0

    def __len__(self) -> int:
        """Number of bits written so far (before padding)."""
        return self._length

    def write_bit(self, bit: int) -> None:
        """Append one bit (any truthy value writes ``1``)."""
        self._parts.append("1" if bit else "0")
        self._length += 1

    def write_bits(self, value: int, nbits: int) -> None:
        """Append the ``nbits`` low-order bits of ``value >= 0``, most significant first."""
        if nbits == 0:
            return
        if value < 0 or value >> nbits:
            raise ValueError(f"value {value} does not fit in {nbits} bits")
        self._parts.append(format(value, f"0{nbits}b"))
        self._length += nbits

    def write_code(self, code: str) -> None:
        """Append a pre-computed code given as a string of ``'0'``/``'1'`` characters."""
        self._parts.append(code)
        self._length += len(code)

    def to_bytes(self) -> bytes:
        """The bits written so far, padded with zero bits to whole bytes."""
        text = "".join(self._parts)
        if not text:
            return b""
        bits = np.frombuffer(text.encode("ascii"), dtype=np.uint8) - np.uint8(ord("0"))
        return np.packbits(bits).tobytes()


class BitReader:
    """Sequential reader over the bits of a byte string (most significant bit first).

    Every read past the end raises :class:`ValueError` (truncated message).
    """

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"expected a bytes-like message, got {type(data).__name__}")
        bits = np.unpackbits(np.frombuffer(bytes(data), dtype=np.uint8))
        self._bits = (bits + np.uint8(ord("0"))).tobytes().decode("ascii")
        self._pos = 0

    @property
    def position(self) -> int:
        """Number of bits consumed so far."""
        return self._pos

    @property
    def remaining(self) -> int:
        """Number of bits not yet consumed."""
        return len(self._bits) - self._pos

    def read_bit(self) -> int:
        """Consume and return one bit."""
        if self._pos >= len(self._bits):
            raise ValueError(f"truncated message: needed 1 more bit at bit {self._pos}")
        bit = self._bits[self._pos] == "1"
        self._pos += 1
        return int(bit)

    def read_bits(self, nbits: int) -> int:
        """Consume ``nbits`` bits and return them as an unsigned integer (MSB first)."""
        if nbits == 0:
            return 0
        end = self._pos + nbits
        if end > len(self._bits):
            raise ValueError(
                f"truncated message: needed {nbits} bits at bit {self._pos}, "
                f"only {self.remaining} left"
            )
        value = int(self._bits[self._pos : end], 2)
        self._pos = end
        return value

    def rest(self) -> str:
        """The unconsumed bits as a string of ``'0'``/``'1'`` (does not consume them)."""
        return self._bits[self._pos :]


# --------------------------------------------------------------------------------------
# Elias-omega code
# --------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def elias_omega_code(n: int) -> str:
    """Elias-omega code of the integer ``n >= 1`` as a string of ``'0'``/``'1'``.

    ``omega(1) = "0"``; for ``n > 1``, starting from ``m = n``: prepend the binary
    representation of ``m`` and set ``m <- bitlength(m) - 1`` while ``m > 1``; the code
    ends with a single ``"0"``. E.g. ``omega(2) = "10 0"``, ``omega(4) = "10 100 0"``,
    ``omega(17) = "10 100 10001 0"``.

    References
    ----------
    P. Elias (1975), "Universal codeword sets and representations of the integers",
    IEEE Trans. Inf. Theory 21(2), 194-203.
    """
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"Elias-omega codes positive integers only (got {n})")
    groups = []
    m = n
    while m > 1:
        binary = format(m, "b")
        groups.append(binary)
        m = len(binary) - 1
    return "".join(reversed(groups)) + "0"


def elias_omega_encode(writer: BitWriter, n: int) -> None:
    """Append the Elias-omega code of ``n >= 1`` to ``writer`` (see :func:`elias_omega_code`)."""
    writer.write_code(elias_omega_code(n))


def elias_omega_decode(reader: BitReader, max_value: int | None = None) -> int:
    """Read one Elias-omega coded integer ``n >= 1`` from ``reader``.

    Starting from ``n = 1``: read a bit; if it is ``0`` return ``n``; otherwise it is the
    leading ``1`` of a group of ``n + 1`` bits whose value becomes the new ``n``.

    Parameters
    ----------
    reader
        The bit source.
    max_value
        If given, a decoded value above it raises :class:`ValueError`.

    Raises
    ------
    ValueError
        If the message ends inside the code, a group is longer than 64 bits (not a value
        this library writes), or the value exceeds ``max_value``.
    """
    n = 1
    while reader.read_bit():
        if n > _MAX_OMEGA_GROUP_BITS:
            raise ValueError(
                f"malformed Elias-omega code at bit {reader.position}: group of {n + 1} bits"
            )
        n = (1 << n) | reader.read_bits(n)
    if max_value is not None and n > max_value:
        raise ValueError(f"decoded value {n} exceeds the maximum {max_value}")
    return n


def elias_omega_length(n: Array) -> Array:
    r"""Exact length in bits of the Elias-omega code of each entry of ``n`` (JAX).

    ``L(1) = 1`` and ``L(n) = 1 + G(n)`` with ``G(1) = 0``,
    ``G(m) = bitlength(m) + G(bitlength(m) - 1)`` (one binary group per step of the
    recursion). Unrolling the recursion for ``n < 2**31``: with ``b = bitlength(n)``
    (:func:`bitlength`), the remaining chain ``G(b - 1)`` only depends on the
    range of ``b`` -- 0 for ``b = 2``, 2 for ``b in [3, 4]``, 5 for ``b in [5, 8]``,
    6 for ``b in [9, 16]``, 10 for ``b in [17, 31]`` -- so

    .. math::

        L(n) = 1 + b + 2[b \ge 3] + 3[b \ge 5] + [b \ge 9] + 4[b \ge 17],
        \qquad n \ge 2.

    Parameters
    ----------
    n
        Integer array of values in ``[1, 2**31 - 1]`` (entries below 1 are treated as 1).

    Returns
    -------
    Array
        int32 array of the same shape.
    """
    n = jnp.asarray(n).astype(jnp.int32)
    b = bitlength(jnp.maximum(n, 1))
    length = (
        1
        + b
        + 2 * (b >= 3).astype(jnp.int32)
        + 3 * (b >= 5).astype(jnp.int32)
        + (b >= 9).astype(jnp.int32)
        + 4 * (b >= 17).astype(jnp.int32)
    )
    return jnp.where(n > 1, length, 1).astype(jnp.int32)


def check_dim(d) -> int:
    """The dimension ``d`` a decoder is given, as a Python int ``>= 0``, else :class:`ValueError`."""
    try:
        d = operator.index(d)
    except TypeError:
        raise ValueError(f"dimension d must be an integer >= 0 (got {d!r})") from None
    if d < 0:
        raise ValueError(f"dimension d must be an integer >= 0 (got {d})")
    return d
