"""MCMC diagnostics through ArviZ, with explicit chain and draw axes."""

from __future__ import annotations

import warnings

import numpy as np


def _az():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import arviz

    return arviz


def rhat(samples: np.ndarray) -> np.ndarray:
    """Rank-normalised split R-hat per coordinate of ``samples[chain, draw, d]``."""
    az = _az()
    return np.asarray(az.rhat(az.convert_to_dataset(samples))["x"])


def ess(samples: np.ndarray) -> np.ndarray:
    """Bulk effective sample size per coordinate of ``samples[chain, draw, d]``."""
    az = _az()
    return np.asarray(az.ess(az.convert_to_dataset(samples))["x"])


def summary(samples: np.ndarray) -> dict:
    """Worst-coordinate R-hat and ESS: what a user checks first."""
    if samples.shape[1] < 4:
        return {"max_rhat": None, "min_ess": None}
    return {"max_rhat": float(np.max(rhat(samples))), "min_ess": float(np.min(ess(samples)))}
