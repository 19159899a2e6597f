"""Unbiased compression operators and the messages they upload.

Compressors (:class:`~fedmcmc.core.base.Compressor`; each owns its message)

* :func:`identity` -- no compression; the message is the vector, float32 on the wire.
* :func:`quantization` -- the stochastic quantiser ``C^(s)`` of QSGD (Alistarh et al. 2017)
  / QLSD (Vono et al., AISTATS 2022, eq. (4)); its state is a :class:`QuantizationState`,
  its message a :class:`QSGDMessage`. :func:`quantization_omega` is its variance factor,
  :func:`qsgd_bits_bound` the QSGD paper's bound on its message length.
* :func:`with_memory` -- error-feedback memory around any compressor (QLSD++): it sends the
  inner message for ``v - eta_i`` and keeps ``eta_i`` in its state.
* :func:`clipped` -- norm clipping of the decoded upload (privacy): the inner message, rescaled
  so that what the server decodes has norm at most ``bound``.
* :func:`fixed_point` -- puts any compressor's decoded messages on a shared fixed-point grid,
  so that the server sums integers (exactly; what secure aggregation needs);
  :func:`weighted_sum` is how a server sums a compressor's messages.
* :func:`resolve_compressor` -- a compressor from a configuration value; :func:`resolve_clipped`
  the same with its uploads clipped where the server sums them (inside a fixed-point grid).

Messages on the wire (:mod:`fedmcmc.compression.codec`)

* :func:`encode` / :func:`decode` -- one message to bytes (:class:`Encoded`) and back,
  checked (:class:`Decoded`); :func:`is_message` tells a compressor's message from a
  plain array.
* :func:`message_bits` -- a message's exact length in bits, what compressors report as
  ``CompressionInfo.bits``.

The bit-level formats (bit buffers, Elias-omega codes, the QSGD and array codecs and
their JAX bit counts) are private modules of this package.

Note: the names :func:`identity` and :func:`quantization` shadow the submodules of the
same name as attributes of this package; import submodule contents with
``from fedmcmc.compression.quantization import ...``.
"""

from fedmcmc.compression._spec import resolve_clipped, resolve_compressor
from fedmcmc.compression.clipping import clipped
from fedmcmc.compression.codec import Decoded, Encoded, decode, encode, is_message, message_bits
from fedmcmc.compression.fixed_point import FixedPointMessage, fixed_point, weighted_sum
from fedmcmc.compression.identity import identity
from fedmcmc.compression.memory import with_memory
from fedmcmc.compression.quantization import (
    QSGDMessage,
    QuantizationState,
    qsgd_bits_bound,
    quantization,
    quantization_omega,
)

__all__ = [
    "identity",
    "quantization",
    "with_memory",
    "clipped",
    "fixed_point",
    "FixedPointMessage",
    "weighted_sum",
    "resolve_compressor",
    "resolve_clipped",
    "QuantizationState",
    "QSGDMessage",
    "quantization_omega",
    "qsgd_bits_bound",
    "Encoded",
    "Decoded",
    "encode",
    "decode",
    "is_message",
    "message_bits",
]
