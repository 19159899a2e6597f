"""The checks the builders (samplers, participation schemes) make of their settings, each written once
(a run's schedule: :func:`fedmcmc.runtime.settings.check_schedule`).

Each returns the value in the form the sampler uses, or raises a one-line :class:`ValueError`
that names the setting, what it got and what to give instead.
"""

from __future__ import annotations

import numpy as np

from fedmcmc.core.types import Schedule


def step_size(value: Schedule, label: str = "step_size") -> Schedule:
    """A schedule as it is, or a constant as a finite positive float."""
    if callable(value):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{label} must be a positive number or a schedule (got {value!r})") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{label} must be > 0 (got {value!r}); the papers use values like 1e-4")
    return number


def positive_int(label: str, value) -> int:
    """An integer >= 1 (given as an int or an integral float)."""
    try:
        ok = int(value) == value and value >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{label} must be a positive integer (got {value!r})")
    return int(value)


#: Below 1 by a relative ``2^-16``: a bound ``C`` applied as ``C * SAFETY`` in float32 stays ``<= C``
#: whatever the rounding of the norm it is compared with (the clipping of uploads and of records).
SAFETY = 1.0 - 2.0**-16


def _number(label: str, value, ok, requirement: str, hint: str) -> float:
    """``value`` as a float if ``ok``; a bool or a string is never a number here."""
    try:
        number = float("nan") if isinstance(value, (bool, np.bool_, str, bytes)) else float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not ok(number):
        raise ValueError(f"{label} must {requirement} (got {value!r}){hint}")
    return number


def positive(label: str, value, hint: str = "") -> float:
    """A finite number > 0."""
    return _number(label, value, lambda x: np.isfinite(x) and x > 0, "be a finite number > 0", hint)


def non_negative(label: str, value, hint: str = "") -> float:
    """A finite number >= 0."""
    return _number(label, value, lambda x: np.isfinite(x) and x >= 0, "be a finite number >= 0", hint)


def unit_interval(label: str, value, hint: str = "") -> float:
    """A number in [0, 1]."""
    return _number(label, value, lambda x: 0.0 <= x <= 1.0, "lie in [0, 1]", hint)


def choice(label: str, value, choices, hint: str = ""):
    """One of ``choices``."""
    if value not in choices:
        raise ValueError(f"unknown {label} {value!r}: choose one of {tuple(choices)}{hint}")
    return value


def per_client(label: str, value, *, sums_to_one: bool = False, hint: str = "") -> np.ndarray:
    """Positive finite numbers, one or one per client (float64, 1-D); with ``sums_to_one``,
    a probability vector over the clients."""
    try:
        arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
    except (TypeError, ValueError):
        arr = np.array([np.nan])
    bad = arr.ndim != 1 or arr.size < 1 or not np.all(np.isfinite(arr)) or np.any(arr <= 0)
    if bad or (sums_to_one and abs(arr.sum() - 1.0) > 1e-6):
        what = "positive and sum to 1" if sums_to_one else "positive numbers"
        raise ValueError(f"{label} must be {what}, one per client (got {value!r}){hint}")
    return arr



def per_client_int(label: str, value) -> np.ndarray:
    """Positive integers, one or one per client (int32, 1-D)."""
    arr = np.atleast_1d(np.asarray(value))
    if (arr.ndim != 1 or arr.size < 1 or not np.issubdtype(arr.dtype, np.number)
            or np.any(arr != np.round(arr)) or np.any(arr < 1)):
        raise ValueError(f"{label} must be a positive integer or one per client (got {value!r})")
    return arr.astype(np.int32)


def client_weights(weights) -> np.ndarray:
    """Client weights ``w_c``: positive, finite, summing to 1."""
    return per_client("client weights w_c", weights, sums_to_one=True, hint="; use FederatedData.weights for n_c / n")
