"""Type aliases shared across fedmcmc."""

from __future__ import annotations

from typing import Any, Callable, Union

import jax

PRNGKey = jax.Array
Array = jax.Array
ArrayTree = Any
#: A step size: a positive float, or a function of the iteration counter ``k`` (an int array).
Schedule = Union[float, Callable[[Array], Array]]


def resolve_schedule(step_size: Schedule, k: Array) -> Array:
    """Return the step size at iteration ``k`` (0-based)."""
    if callable(step_size):
        return step_size(k)
    return jax.numpy.asarray(step_size)
