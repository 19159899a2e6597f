"""Unbiased compression operators and their bit-exact wire codecs.

* :func:`identity` -- no compression, float32 on the wire (:func:`encode_dense`).
* :func:`quantization` -- the stochastic quantiser ``C^(s)`` of QSGD (Alistarh et al.
  2017) / QLSD (Vono et al., AISTATS 2022, eq. (4)), Elias-omega or fixed-width coded
  on the wire (:func:`encode_qsgd`); ``CompressionInfo.bits`` is the exact message
  length.
* :func:`with_memory` -- error-feedback memory around any compressor (QLSD++): it sends the
  inner message for ``v - eta_i`` and keeps ``eta_i`` in its state.
* :func:`resolve_compressor` -- build a compressor from a configuration value.

Note: the names :func:`identity` and :func:`quantization` shadow the submodules of the
same name as attributes of this package; import submodule contents with
``from fedmcmc.compression.quantization import ...``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedmcmc.core.base import Compressor
from fedmcmc.compression.codec import (
    decode_dense,
    decode_qsgd,
    elias_omega_length,
    encode_dense,
    encode_qsgd,
    qsgd_encoded_bits,
)
from fedmcmc.compression.identity import identity
from fedmcmc.compression.memory import with_memory
from fedmcmc.compression.quantization import (
    QSGDMessage,
    QuantizationState,
    dequantize,
    dequantize_np,
    qsgd_bits_bound,
    quantization,
    quantize,
)

__all__ = [
    "identity",
    "quantization",
    "with_memory",
    "QuantizationState",
    "QSGDMessage",
    "quantize",
    "dequantize",
    "dequantize_np",
    "qsgd_bits_bound",
    "encode_qsgd",
    "decode_qsgd",
    "qsgd_encoded_bits",
    "encode_dense",
    "decode_dense",
    "elias_omega_length",
    "resolve_compressor",
]

_SPEC_HELP = (
    'use None, "none", "identity" or 0 for no compression; an integer s >= 1 for s '
    'quantisation levels; {"bits": p} for s = 2**p; {"levels": s} or {"levels": [s_1, ...]} '
    "for (per-client) levels"
)


def _bits_to_levels(bits):
    def one(p, where=""):
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)):
            raise ValueError(
                f"quantization bits p{where} must be an integer in [0, 24] (got {p!r}); "
                "p bits means s = 2**p levels"
            )
        if not 0 <= p <= 24:
            raise ValueError(
                f"quantization bits p{where} must be an integer in [0, 24] (got {p!r}); "
                "p bits means s = 2**p levels"
            )
        return 2 ** int(p)

    if isinstance(bits, (Sequence, np.ndarray)) and not isinstance(bits, (str, bytes)):
        values = list(bits)
        if not values:
            raise ValueError('{"bits": [...]} needs at least one entry')
        return [one(p, f"[{i}]") for i, p in enumerate(values)]
    return one(bits)


def resolve_compressor(spec) -> Compressor:
    """Build a compressor from a configuration value.

    Parameters
    ----------
    spec
        * ``None``, ``"none"``, ``"identity"`` or ``0``: :func:`identity`;
        * an integer ``s >= 1``: ``quantization(s)``;
        * a sequence of integers: ``quantization(levels)`` (one per client);
        * ``{"bits": p}`` (``p`` in ``[0, 24]`` or a list of them): ``quantization(2**p)``;
        * ``{"levels": s}`` or ``{"levels": [s_1, ..., s_b]}``: ``quantization(levels)``;
        * a :class:`~fedmcmc.core.base.Compressor`: returned unchanged.

    Returns
    -------
    Compressor

    Raises
    ------
    ValueError
        For any other value, with a message listing the accepted forms.
    """
    if spec is None or isinstance(spec, Compressor):
        return identity() if spec is None else spec
    if isinstance(spec, str):
        if spec.strip().lower() in ("none", "identity"):
            return identity()
        raise ValueError(f"unknown compressor spec {spec!r}; {_SPEC_HELP}")
    if isinstance(spec, (bool, np.bool_)):
        raise ValueError(f"invalid compressor spec {spec!r}; {_SPEC_HELP}")
    if isinstance(spec, (int, np.integer)) and spec == 0:
        return identity()
    if isinstance(spec, (int, float, np.integer, np.floating)):
        return quantization(spec)  # validates: integer >= 1
    if isinstance(spec, Mapping):
        keys = set(spec)
        if keys == {"bits"}:
            return quantization(_bits_to_levels(spec["bits"]))
        if keys == {"levels"}:
            return quantization(spec["levels"])
        raise ValueError(
            f"compressor spec dict must have exactly one key, 'bits' or 'levels' "
            f"(got keys {sorted(map(str, keys))}); {_SPEC_HELP}"
        )
    if isinstance(spec, (Sequence, np.ndarray)):
        return quantization(spec)
    raise ValueError(f"invalid compressor spec {spec!r}; {_SPEC_HELP}")
