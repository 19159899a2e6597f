"""Stochastic gradients as an evaluation plus an additive noise, and the gradient-noise wrapper.

A stochastic gradient ``g(xi, theta) = m(xi, theta) + e(xi)`` is an evaluation ``m`` (exact, or
a minibatch estimate) and a zero-mean noise ``e`` (e.g. the N(0, sigma^2 I) of Liang et al.'s
simulated stochastic gradients, 2024, Section 5). Keeping the two apart lets an integrator that
draws twice at one point (the leapfrog's closing half-kick and the next opening one,
:func:`fedmcmc.samplers.integrators.leapfrog_step`) reuse a deterministic evaluation and draw only a new noise.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import numpy as np


class StochasticGradient(NamedTuple):
    """A stochastic gradient ``g(xi, theta) = m(xi, theta) + e(xi)``.

    Attributes
    ----------
    evaluate
        ``evaluate(key, theta)``: the evaluation ``m``, exact or a minibatch estimate.
    noise
        ``noise(key, theta)``: zero-mean noise added to every draw, or None.
    deterministic
        ``evaluate`` ignores its key (an exact gradient): a new draw at the same point reuses the
        evaluation and draws only a new noise.
    """

    evaluate: Callable[[Any, Any], Any]
    noise: Callable[[Any, Any], Any] | None = None
    deterministic: bool = False

    def sample(self, key, theta, evaluation=None):
        """A draw at ``theta`` with its own randomness ``key``; returns ``(g, m)``, the draw and
        its evaluation. ``evaluation``, the one at ``theta``, is reused if ``deterministic``."""
        key_eval, key_noise = jax.random.split(key)
        m = evaluation if self.deterministic and evaluation is not None else self.evaluate(key_eval, theta)
        return (m if self.noise is None else m + self.noise(key_noise, theta)), m


def as_stochastic_gradient(grad) -> StochasticGradient:
    """``grad`` itself if a :class:`StochasticGradient`, else ``grad(key, theta)`` as one (a fresh
    evaluation at every draw)."""
    return grad if isinstance(grad, StochasticGradient) else StochasticGradient(grad)


def gaussian_noise(grad: StochasticGradient, sigma: float) -> StochasticGradient:
    """``grad`` with N(0, sigma^2 I) added to every draw, from the draw's noise key (``grad``
    itself if ``sigma`` is 0). ``grad`` must have no noise of its own."""
    if sigma == 0:
        return grad
    if grad.noise is not None:
        raise ValueError("gaussian_noise wraps a gradient without noise")
    scale = np.float32(sigma)

    def noise(key, theta):
        return scale * jax.random.normal(key, theta.shape, theta.dtype)

    return grad._replace(noise=noise)
