"""Bayesian multilayer perceptron classifier, prior theta ~ N(0, prior_scale^2 I) on all weights
and biases.

``mlp(input_dim, hidden=(h_1, ..., h_L), num_classes=K)`` is the network

    x [input_dim] -> dense h_1 -> act -> ... -> dense h_L -> act -> dense K -> logits,

with a softmax (categorical) likelihood for ``K >= 2`` and, for ``K = 1``, a Bernoulli
likelihood on one logit, ``p(y = 1 | x) = sigmoid(z)`` with ``y`` in {0, 1}.

Layout of ``theta`` (row-major blocks, in this order): ``dense1/w`` ``[input_dim, h_1]``,
``dense1/b`` ``[h_1]``, ..., ``dense{L+1}/w`` ``[h_L, K]``, ``dense{L+1}/b`` ``[K]``; so
``d = sum_l (n_{l-1} + 1) n_l`` with ``n_0 = input_dim``, ``n_{L+1} = K``.

FSGLD's network (El Mekkaoui et al., 2021, Section 5.3: "three hidden layers. The first two
hidden layers consist of 18 nodes each, and the last one of 8") is
``mlp(input_dim, hidden=(18, 18, 8), num_classes=1)``; on SUSY's 18 features d =
18*18+18 + 18*18+18 + 18*8+8 + 8+1 = 845. The input size is ``input_dim`` and is not counted
in ``hidden``.
"""

from __future__ import annotations

import jax

from fedmcmc.core.base import Model
from fedmcmc.models.layout import (ParamLayout, activation_fn, bernoulli_log_likelihood, bernoulli_probs,
                                   categorical_log_likelihood, check_positive_int, flat_input, flat_inputs,
                                   gaussian_log_prior, weight_scale)


def mlp_layout(input_dim: int, hidden=(100,), num_classes: int = 10, activation: str = "relu") -> ParamLayout:
    """Blocks ``dense{l}/w`` ``[n_{l-1}, n_l]`` and ``dense{l}/b`` ``[n_l]``, l = 1..L+1.

    Initial scales: He ``sqrt(2 / fan_in)`` for weights feeding a ReLU, Glorot
    ``sqrt(2 / (fan_in + fan_out))`` for weights feeding tanh and for the output layer;
    biases start at zero.
    """
    activation_fn(activation)
    sizes = [check_positive_int("input_dim", input_dim)]
    sizes += [check_positive_int("hidden layer size", h) for h in tuple(hidden)]
    sizes.append(check_positive_int("num_classes", num_classes))
    names, shapes, scales = [], [], []
    for layer, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        act = activation if layer < len(sizes) - 1 else None
        names += [f"dense{layer}/w", f"dense{layer}/b"]
        shapes += [(n_in, n_out), (n_out,)]
        scales += [weight_scale(act, n_in, n_out), 0.0]
    return ParamLayout(tuple(names), tuple(shapes), tuple(scales))


def mlp(input_dim: int, hidden=(100,), num_classes: int = 10, activation: str = "relu",
        prior_scale: float = 1.0) -> Model:
    """Build the model; a datum is ``(x, y)``, ``x`` with ``input_dim`` entries (any shape, e.g.
    ``[28, 28]`` images with ``input_dim=784``, flattened row-major) and ``y`` an integer label
    in ``{0, ..., K-1}`` (in {0, 1} when ``num_classes == 1``).

    ``activation`` is ``"relu"`` or ``"tanh"``. ``predict(theta, inputs)`` maps ``[n, ...]``
    inputs to class probabilities ``[n, K]``, or ``[n, 2]`` = ``(p(y=0), p(y=1))`` when
    ``num_classes == 1``.
    """
    layout = mlp_layout(input_dim, hidden, num_classes, activation)
    act = activation_fn(activation)
    log_prior = gaussian_log_prior(prior_scale)
    num_layers = len(layout.names) // 2
    binary = num_classes == 1

    def forward(params, x):
        # x: [..., input_dim] -> logits [..., K]
        for layer in range(1, num_layers + 1):
            x = x @ params[f"dense{layer}/w"] + params[f"dense{layer}/b"]
            if layer < num_layers:
                x = act(x)
        return x

    def log_likelihood(theta, datum):
        x, y = datum
        z = forward(layout.unflatten(theta), flat_input(x, input_dim, theta.dtype))
        return bernoulli_log_likelihood(z[0], y) if binary else categorical_log_likelihood(z, y)

    def predict(theta, inputs):
        z = forward(layout.unflatten(theta), flat_inputs(inputs, input_dim, theta.dtype))
        return bernoulli_probs(z[:, 0]) if binary else jax.nn.softmax(z, axis=-1)

    widths = "-".join(str(n) for n in (input_dim, *tuple(hidden), num_classes))
    return Model(log_likelihood, log_prior, layout.dim, name=f"mlp-{widths}-{activation}",
                 predict=jax.jit(predict), layout=layout)
