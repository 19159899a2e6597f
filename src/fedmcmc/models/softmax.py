"""Bayesian multinomial (softmax) logistic regression: y in {0, ..., K-1},
p(y = k | x, theta) = softmax(x W + b)_k, prior theta ~ N(0, prior_scale^2 I) on all of W and b.

``theta`` is the flattening of ``W`` ``[F, K]`` (row-major) followed by ``b`` ``[K]`` (absent
when ``intercept=False``): ``d = F K (+ K)``. The softmax is over-parametrised (adding a vector
to every column of ``W`` changes no probability); the Gaussian prior makes the posterior proper.
With ``K = 2``, ``W[:, 0] = 0`` and ``W[:, 1] = w`` it is the binary logistic regression with
weights ``w``.
"""

from __future__ import annotations

import jax

from fedmcmc.core.base import Model
from fedmcmc.models.layout import (ParamLayout, categorical_log_likelihood, check_positive_int, flat_input,
                                   flat_inputs, gaussian_log_prior)


def multinomial_layout(num_features: int, num_classes: int, intercept: bool = True) -> ParamLayout:
    """Blocks ``W`` ``[F, K]`` and ``b`` ``[K]``; both start at zero (the posterior is log-concave)."""
    f = check_positive_int("num_features", num_features)
    k = check_positive_int("num_classes", num_classes)
    if k < 2:
        raise ValueError(f"num_classes must be >= 2 (got {k}); for two classes with one logit use "
                         "fedmcmc.models.logistic.logistic_regression")
    names, shapes = ("W",), ((f, k),)
    if intercept:
        names, shapes = names + ("b",), shapes + ((k,),)
    return ParamLayout(names, shapes, (0.0,) * len(names))


def multinomial_logistic_regression(num_features: int, num_classes: int, prior_scale: float = 1.0,
                                    intercept: bool = True) -> Model:
    """Build the model; a datum is ``(x, y)``, ``x`` with ``num_features`` entries (any shape,
    flattened) and ``y`` an integer label in ``{0, ..., K-1}`` (a float label is truncated).

    ``predict(theta, inputs)`` maps ``[n, num_features]`` inputs to probabilities ``[n, K]``.
    """
    layout = multinomial_layout(num_features, num_classes, intercept)
    log_prior = gaussian_log_prior(prior_scale)
    f = layout.shapes["W"][0]

    def logits(params, x):
        z = x @ params["W"]
        return z + params["b"] if intercept else z

    def log_likelihood(theta, datum):
        x, y = datum
        return categorical_log_likelihood(logits(layout.unflatten(theta), flat_input(x, f, theta.dtype)), y)

    def predict(theta, inputs):
        return jax.nn.softmax(logits(layout.unflatten(theta), flat_inputs(inputs, f, theta.dtype)), axis=-1)

    return Model(log_likelihood, log_prior, layout.dim, name="multinomial-logistic-regression",
                 predict=jax.jit(predict), layout=layout)

