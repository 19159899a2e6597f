"""Bayesian LeNet-5 classifier, prior theta ~ N(0, prior_scale^2 I) on all weights and biases.

The network, for an input ``[H, W, C]`` (NHWC, kernels HWIO):

    conv 6@5x5 'SAME' -> act -> pool 2x2 -> conv 16@5x5 'VALID' -> act -> pool 2x2
    -> flatten -> dense 120 -> act -> dense 84 -> act -> dense K -> logits (softmax likelihood)

``act`` is ReLU by default (``activation="tanh"`` for the original), ``pool`` is max pooling by
default (``pooling="avg"`` for the original subsampling); pools are non-overlapping 2x2 windows
with stride 2, an odd last row/column being dropped. For ``[28, 28, 1]`` inputs the maps are
28x28x6 -> 14x14x6 -> 10x10x16 -> 5x5x16 = 400 features, and ``d = 61,706``:
156 + 2,416 + 48,120 + 10,164 + 850.

Layout of ``theta`` (row-major blocks, in this order): ``conv1/w`` ``[5, 5, C, 6]``,
``conv1/b`` ``[6]``, ``conv2/w`` ``[5, 5, 6, 16]``, ``conv2/b`` ``[16]``, ``dense1/w``
``[F, 120]`` (``F`` = features after the second pool, flattened in (h, w, c) order),
``dense1/b`` ``[120]``, ``dense2/w`` ``[120, 84]``, ``dense2/b`` ``[84]``, ``dense3/w``
``[84, K]``, ``dense3/b`` ``[K]``.

A datum's ``x`` may have any shape with ``H * W * C`` entries, read in row-major (h, w, c)
order: ``[28, 28]``, ``[28, 28, 1]`` or ``[784]`` for MNIST. Inputs are cast to the dtype of
``theta`` and used as given (scale pixel values, e.g. to [0, 1], beforehand).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from fedmcmc.core.base import Model
from fedmcmc.models.layout import (ParamLayout, activation_fn, categorical_log_likelihood, check_positive_int,
                                   gaussian_log_prior, weight_scale)

_POOLS = ("max", "avg")


def _feature_shape(input_shape) -> tuple[int, int, int]:
    h, w, _ = input_shape
    h2, w2 = h // 2 - 4, w // 2 - 4  # after pool 1 and the VALID 5x5 conv
    if h2 < 2 or w2 < 2:
        raise ValueError(f"LeNet-5 needs inputs of at least 12x12 (got {input_shape[:2]})")
    return h2 // 2, w2 // 2, 16


def _input_shape(input_shape) -> tuple[int, int, int]:
    shape = tuple(int(s) for s in input_shape)
    if len(shape) == 2:
        shape = shape + (1,)
    if len(shape) != 3:
        raise ValueError(f"input_shape must be (H, W) or (H, W, C) (got {input_shape!r})")
    for s in shape:
        check_positive_int("input_shape entry", s)
    return shape


def lenet5_layout(input_shape=(28, 28, 1), num_classes: int = 10, activation: str = "relu") -> ParamLayout:
    """The blocks of :func:`lenet5` (see the module docstring).

    Initial scales: He ``sqrt(2 / fan_in)`` for weights feeding a ReLU, Glorot
    ``sqrt(2 / (fan_in + fan_out))`` for weights feeding tanh and for the output layer
    (a conv kernel's fans are ``25 * in_channels`` and ``25 * out_channels``); biases start at zero.
    """
    activation_fn(activation)
    h, w, c = _input_shape(input_shape)
    k = check_positive_int("num_classes", num_classes)
    if k < 2:
        raise ValueError(f"num_classes must be >= 2 (got {k})")
    features = math.prod(_feature_shape((h, w, c)))
    layers = [("conv1", (5, 5, c, 6), 25 * c, 25 * 6, activation),
              ("conv2", (5, 5, 6, 16), 25 * 6, 25 * 16, activation),
              ("dense1", (features, 120), features, 120, activation),
              ("dense2", (120, 84), 120, 84, activation),
              ("dense3", (84, k), 84, k, None)]
    names, shapes, scales = [], [], []
    for name, shape, fan_in, fan_out, act in layers:
        names += [f"{name}/w", f"{name}/b"]
        shapes += [shape, (shape[-1],)]
        scales += [weight_scale(act, fan_in, fan_out), 0.0]
    return ParamLayout(tuple(names), tuple(shapes), tuple(scales))


def _pool(x, kind: str):
    """Non-overlapping 2x2 pooling of ``[n, H, W, C]`` (an odd last row/column is dropped)."""
    n, h, w, c = x.shape
    x = x[:, : h - h % 2, : w - w % 2, :].reshape(n, h // 2, 2, w // 2, 2, c)
    return jnp.max(x, axis=(2, 4)) if kind == "max" else jnp.mean(x, axis=(2, 4))


def _conv(x, kernel, bias, padding: str):
    y = jax.lax.conv_general_dilated(x, kernel, window_strides=(1, 1), padding=padding,
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + bias


def lenet5(input_shape=(28, 28, 1), num_classes: int = 10, prior_scale: float = 1.0, activation: str = "relu",
           pooling: str = "max") -> Model:
    """Build the model; a datum is ``(x, y)``, ``x`` with ``H * W * C`` entries (see the module
    docstring) and ``y`` an integer label in ``{0, ..., K-1}``.

    ``predict(theta, inputs)`` maps a batch ``[n, ...]`` of inputs to probabilities ``[n, K]``,
    running the network once on the whole batch.
    """
    shape = _input_shape(input_shape)
    layout = lenet5_layout(shape, num_classes, activation)
    if pooling not in _POOLS:
        raise ValueError(f"pooling must be one of {_POOLS} (got {pooling!r})")
    act = activation_fn(activation)
    log_prior = gaussian_log_prior(prior_scale)
    size = math.prod(shape)

    def forward(params, x):
        # x: [n, H, W, C] -> logits [n, K]
        x = _pool(act(_conv(x, params["conv1/w"], params["conv1/b"], "SAME")), pooling)
        x = _pool(act(_conv(x, params["conv2/w"], params["conv2/b"], "VALID")), pooling)
        x = x.reshape(x.shape[0], -1)
        x = act(x @ params["dense1/w"] + params["dense1/b"])
        x = act(x @ params["dense2/w"] + params["dense2/b"])
        return x @ params["dense3/w"] + params["dense3/b"]

    def log_likelihood(theta, datum):
        x, y = datum
        x = jnp.asarray(x)
        if x.size != size:
            raise ValueError(f"an input must have {size} entries for input_shape {shape} (got shape {x.shape})")
        z = forward(layout.unflatten(theta), x.reshape((1,) + shape).astype(theta.dtype))
        return categorical_log_likelihood(z[0], y)

    def predict(theta, inputs):
        inputs = jnp.asarray(inputs)
        if inputs.ndim < 1 or math.prod(inputs.shape[1:]) != size:
            raise ValueError(f"inputs must have shape [n, ...] with {size} entries per input (got {inputs.shape})")
        x = inputs.reshape((inputs.shape[0],) + shape).astype(theta.dtype)
        return jax.nn.softmax(forward(layout.unflatten(theta), x), axis=-1)

    h, w, c = shape
    return Model(log_likelihood, log_prior, layout.dim, name=f"lenet5-{h}x{w}x{c}-{activation}-{pooling}",
                 predict=jax.jit(predict), layout=layout)
