"""Norm clipping of a client's upload: a wrapper that bounds the norm of what the server decodes.

``clipped(C, bound)`` sends the inner compressor's message for ``v``, rescaled so that the
vector the server decodes has norm at most ``bound``:

    m = C(v),      m <- m * min(1, bound / ||decode(m)||).

Where the bound holds
---------------------
Differential privacy of the released draws needs a bound on what enters the server's
aggregate, which is the *decoded* message, not the client's vector. Clipping ``v`` before
compression is not enough: the QSGD decoding ``||v|| sign(v_i) l_i / s`` has norm up to
``(1 + sqrt(d) / s) ||v||`` (``l_i <= floor(r_i) + 1``; QSGD Lemma 3.1), so a client whose
``||v|| <= bound`` can still upload a vector longer than ``bound``. This wrapper therefore
clips after compression, on the message itself: a :class:`~fedmcmc.compression.QSGDMessage`
gets its ``norm`` field scaled (levels and ``s`` untouched, so the format, the codec and the
bit count are those of the inner message), and a plain array is scaled. The factor is
computed from the decoded vector in float32 and shrunk by ``checks.SAFETY`` (a relative ``2^-16``),
so that the float32 decoding of the scaled message is at most ``bound`` exactly, rounding
included (``tests/compression/test_clipping.py``).

Bias and variance
-----------------
Clipping trades bias for sensitivity. While ``||decode(C(v))|| <= bound`` nothing changes
and the upload stays unbiased. Above it the upload is shrunk towards 0: the server's drift is
biased towards the prior (a client's likelihood counts for less), and the bias grows with how
often and by how much the bound binds; the variance of the upload can only fall (a
contraction). Clipping the decoded message binds more often than clipping ``v`` would, by up to
the factor ``1 + sqrt(d) / s`` for coarse quantisers: that is the price of a bound that holds
for what the server sees. A smaller ``bound`` buys privacy (the noise multiplier is
``sqrt(2 / gamma) / (w bound)``, :mod:`fedmcmc.privacy`) with bias.

Off by default: a compressor that is not wrapped is unchanged, bit for bit.
"""

from __future__ import annotations

import jax.numpy as jnp

from fedmcmc.compression.quantization import QSGDMessage
from fedmcmc.core import checks
from fedmcmc.core.base import Compressor
from fedmcmc.core.types import Array, PRNGKey

__all__ = ["clipped", "scale_message"]


def scale_message(message, factor: Array):
    """``message`` whose decoding is ``factor`` times the original's: a QSGD message's ``norm``
    field is scaled, any other message (an array) is scaled itself."""
    if isinstance(message, QSGDMessage):
        return message._replace(norm=(message.norm * factor).astype(message.norm.dtype))
    return (message * factor).astype(message.dtype)


def clipped(compressor: Compressor, bound: float) -> Compressor:
    """Wrap ``compressor`` so that every decoded upload has norm at most ``bound``.

    Parameters
    ----------
    compressor
        The inner compressor (identity, quantisation, ...).
    bound
        ``C > 0``, the largest norm of a decoded upload.

    Returns
    -------
    Compressor
        The inner ``init``, ``decode`` and ``omega`` (the inner operator's variance factor; the
        clip only shrinks); ``apply`` sends the inner message rescaled (see the module docstring)
        and reports the inner message's bits.

    Raises
    ------
    ValueError
        If ``bound`` is not a finite positive number.
    """
    bound = checks.positive("clipping bound", bound, "; it is the largest norm of a client's decoded upload")
    limit = jnp.float32(bound) * jnp.float32(checks.SAFETY)

    def apply(key: PRNGKey, v: Array, state):
        message, state, info = compressor.apply(key, v, state)
        norm = jnp.linalg.norm(compressor.decode(message))
        factor = jnp.where(norm > limit, limit / jnp.where(norm > 0, norm, 1.0), 1.0)
        return scale_message(message, factor), state, info

    return compressor._replace(apply=apply, name=f"clip{bound:g}({compressor.name})")
