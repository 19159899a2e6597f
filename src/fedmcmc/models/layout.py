"""Named parameter blocks inside one flat vector, for models with weight matrices.

A network's parameters travel as ONE flat float vector ``theta`` (compressors encode flat
vectors); a :class:`ParamLayout` says which slice of ``theta`` is which named array, so that
a model can unflatten internally and others can inspect or compress per layer::

    layout = mlp_layout(18, hidden=(18, 8), num_classes=1)
    layout.shapes          # {'dense1/w': (18, 18), 'dense1/b': (18,), ...}   (= param_shapes)
    layout.slices          # {'dense1/w': slice(0, 324), ...}
    params = layout.unflatten(theta)   # dict of arrays; theta may carry leading batch axes
    theta = layout.flatten(params)
    theta0 = initial_position(key, layout)   # Glorot/He-scaled weights, zero biases

Blocks are stored in order, each block row-major (C order), so ``flatten`` and
``unflatten`` are inverse to each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Mapping

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class ParamLayout:
    """The blocks of a flat parameter vector.

    Attributes
    ----------
    names
        Block names, in the order the blocks appear in ``theta``.
    block_shapes
        The shape of each block.
    init_scales
        The standard deviation of each block at initialisation (0 for a block started at zero,
        such as a bias); see :meth:`init`.
    """

    names: tuple[str, ...]
    block_shapes: tuple[tuple[int, ...], ...]
    init_scales: tuple[float, ...]

    def __post_init__(self):
        if not (len(self.names) == len(self.block_shapes) == len(self.init_scales)):
            raise ValueError("names, block_shapes and init_scales must have the same length")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"block names must be distinct (got {self.names})")

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.block_shapes)

    @property
    def dim(self) -> int:
        """The length ``d`` of ``theta``."""
        return sum(self.sizes)

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """``{name: shape}`` in order (the ``param_shapes``)."""
        return dict(zip(self.names, self.block_shapes))

    @property
    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """The same as :attr:`shapes`."""
        return self.shapes

    @property
    def slices(self) -> dict[str, slice]:
        """``{name: slice}``: where each block lies in ``theta``."""
        out, start = {}, 0
        for name, size in zip(self.names, self.sizes):
            out[name] = slice(start, start + size)
            start += size
        return out

    def unflatten(self, theta) -> dict:
        """Split ``theta`` (shape ``[..., d]``) into ``{name: array [..., *shape]}``."""
        theta = jnp.asarray(theta)
        if theta.shape[-1:] != (self.dim,):
            raise ValueError(f"theta must have last axis {self.dim} (got shape {theta.shape})")
        lead = theta.shape[:-1]
        # one split, not a slice per block: the gradient of a split is ONE concatenation of the
        # blocks' gradients, where that of slices is a sum of zero-padded copies of theta's size
        # (a full-length buffer per block, re-added in every consumer of the gradient)
        blocks = jnp.split(theta, [sl.stop for sl in self.slices.values()][:-1], axis=-1)
        return {name: block.reshape(lead + shape)
                for name, block, shape in zip(self.names, blocks, self.block_shapes)}

    def flatten(self, params: Mapping) -> jax.Array:
        """The inverse of :meth:`unflatten` (blocks may carry the same leading batch axes)."""
        missing = set(self.names) - set(params)
        if missing:
            raise ValueError(f"missing blocks {sorted(missing)}")
        parts = []
        lead = None
        for name, shape in zip(self.names, self.block_shapes):
            a = jnp.asarray(params[name])
            if a.ndim < len(shape) or a.shape[a.ndim - len(shape):] != shape:
                raise ValueError(f"block {name!r} has shape {a.shape}, expected [..., {shape}]")
            this_lead = a.shape[:a.ndim - len(shape)]
            lead = this_lead if lead is None else lead
            if this_lead != lead:
                raise ValueError(f"block {name!r} has leading axes {this_lead}, others {lead}")
            parts.append(a.reshape(lead + (-1,)))
        return jnp.concatenate(parts, axis=-1)

    def init(self, key, dtype=jnp.float32) -> jax.Array:
        """A starting ``theta``: block ``k`` ~ N(0, init_scales[k]^2), independently."""
        return _init(self, key, jnp.dtype(dtype))


@partial(jax.jit, static_argnums=(0, 2))
def _init(layout: ParamLayout, key, dtype):
    keys = jax.random.split(key, len(layout.names))
    parts = [scale * jax.random.normal(k, (size,), dtype) if scale > 0 else jnp.zeros((size,), dtype)
             for k, size, scale in zip(keys, layout.sizes, layout.init_scales)]
    return jnp.concatenate(parts)


def initial_position(key, layout: ParamLayout, dtype=jnp.float32) -> jax.Array:
    """A sensible start for SG-MCMC on a network: ``layout.init(key)``.

    Weights are Gaussian with He scale ``sqrt(2 / fan_in)`` before a ReLU and Glorot scale
    ``sqrt(2 / (fan_in + fan_out))`` before tanh and for the output layer; biases are zero
    (the scales are fixed by the layout builders, e.g. :func:`fedmcmc.models.mlp.mlp_layout`).
    """
    return layout.init(key, dtype)


def he_scale(fan_in: int) -> float:
    return math.sqrt(2.0 / fan_in)


def glorot_scale(fan_in: int, fan_out: int) -> float:
    return math.sqrt(2.0 / (fan_in + fan_out))


def weight_scale(activation: str | None, fan_in: int, fan_out: int) -> float:
    """He scale before a ReLU, Glorot scale otherwise (tanh, or the output layer: ``None``)."""
    return he_scale(fan_in) if activation == "relu" else glorot_scale(fan_in, fan_out)


ACTIVATIONS = {"relu": jax.nn.relu, "tanh": jnp.tanh}


def activation_fn(activation: str):
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)} (got {activation!r})")
    return ACTIVATIONS[activation]


def gaussian_log_prior(prior_scale: float):
    """``theta -> -||theta||^2 / (2 prior_scale^2)``: N(0, prior_scale^2 I) up to its constant,
    as in the other models (counted once, on the server)."""
    if not prior_scale > 0 or not math.isfinite(prior_scale):
        raise ValueError(f"prior_scale must be > 0 and finite (got {prior_scale})")
    t2 = float(prior_scale) ** 2

    def log_prior(theta):
        return -0.5 * jnp.sum(theta**2) / t2

    return log_prior


def check_positive_int(label: str, value) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{label} must be a positive integer (got {value!r})")
    return int(value)


def flat_input(x, size: int, dtype):
    """One datum's input as a vector of ``size`` entries (any shape with that many entries)."""
    x = jnp.asarray(x)
    if x.size != size:
        raise ValueError(f"an input must have {size} entries (got shape {x.shape})")
    return x.reshape(size).astype(dtype)


def flat_inputs(inputs, size: int, dtype):
    """A batch ``[n, ...]`` of inputs as ``[n, size]`` (each input any shape with ``size`` entries)."""
    inputs = jnp.asarray(inputs)
    if inputs.ndim < 1 or math.prod(inputs.shape[1:]) != size:
        raise ValueError(f"inputs must have shape [n, ...] with {size} entries per input (got {inputs.shape})")
    return inputs.reshape(inputs.shape[0], size).astype(dtype)


def categorical_log_likelihood(logits, y):
    """``log softmax(logits)[y]`` for one datum with integer label ``y``."""
    y = jnp.asarray(y).astype(jnp.int32)
    picked = jnp.sum(jnp.where(jnp.arange(logits.shape[-1]) == y, logits, 0.0))
    return picked - jax.nn.logsumexp(logits)


def bernoulli_log_likelihood(logit, y):
    """``y log sigmoid(z) + (1 - y) log sigmoid(-z)`` for ``y`` in {0, 1}."""
    y = jnp.asarray(y).astype(logit.dtype)
    return y * logit - jax.nn.softplus(logit)


def bernoulli_probs(logits):
    """``[n]`` logits -> ``[n, 2]`` probabilities ``(p(y=0), p(y=1))``."""
    return jnp.stack([jax.nn.sigmoid(-logits), jax.nn.sigmoid(logits)], axis=-1)
