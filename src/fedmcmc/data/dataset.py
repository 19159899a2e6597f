"""A data set held in memory, and the checked constructors that the loaders share.

:class:`Dataset` is what every loader returns, built-in (:mod:`fedmcmc.data.builtin`) or a
user's file (:mod:`fedmcmc.data.files`): a classification set (float32 inputs, int32 class
indices) or a regression set (float64 inputs and targets, ``num_classes`` None).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Dataset(NamedTuple):
    """A classification or regression data set held in memory.

    Attributes
    ----------
    x
        Inputs ``[n, ...]`` (images keep their ``[h, w]`` axes): float32 for a classification
        set, float64 for a regression set.
    y
        Class indices, int32 ``[n]`` in ``0 .. num_classes - 1``; or float64 targets ``[n]``
        of a regression set.
    num_classes
        Number of classes ``K``; None for a regression set.
    name
        Short name (e.g. ``"mnist5k"``, or the file name for users' data).
    source
        Where the data came from (package and version, or file path), for outputs.
    test
        ``(x_test, y_test)`` when the set ships its own test split, else ``None``.
    classes
        Names of the classes in index order (original label values for users' files),
        or ``None`` when the indices are the labels.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int | None
    name: str
    source: str
    test: tuple[np.ndarray, np.ndarray] | None = None
    classes: tuple[str, ...] | None = None

    @property
    def num_points(self) -> int:
        return int(self.y.shape[0])

    def summary(self) -> dict:
        """Sizes, shapes and class counts (classification), for outputs."""
        out = {"name": self.name, "source": self.source, "num_points": self.num_points,
               "input_shape": list(self.x.shape[1:]), "num_classes": self.num_classes}
        if self.num_classes is not None:
            out["class_counts"] = np.bincount(self.y, minlength=self.num_classes).tolist()
        out["num_test"] = None if self.test is None else int(self.test[1].shape[0])
        if self.classes is not None:
            out["classes"] = list(self.classes)
        return out


def classification_set(x, y, name: str, source: str, num_classes: int | None = None, test=None,
                       classes=None) -> Dataset:
    """A classification :class:`Dataset`, cast and checked: float32 inputs, int32 labels in range,
    matching lengths; ``num_classes`` defaults to the largest label + 1."""
    x = np.asarray(x, np.float32)
    y = np.asarray(y)
    if y.ndim != 1 or x.shape[:1] != y.shape:
        raise ValueError(f"{name}: need x [n, ...] and y [n]; got x {x.shape} and y {y.shape}")
    if y.size and not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{name}: labels must be integers (got dtype {y.dtype})")
    y = y.astype(np.int32)
    ys = [y] if test is None else [y, np.asarray(test[1])]
    top = max(int(v.max()) for v in ys if v.size) if any(v.size for v in ys) else -1
    if any(v.size and int(v.min()) < 0 for v in ys):
        raise ValueError(f"{name}: labels must be class indices >= 0")
    k = top + 1 if num_classes is None else int(num_classes)
    if top >= k:
        raise ValueError(f"{name}: label {top} is out of range for num_classes={k}")
    if test is not None:
        xt, yt = test
        test = classification_set(xt, yt, name + " (test)", source, k).x, np.asarray(yt, np.int32)
        if test[0].shape[1:] != x.shape[1:]:
            raise ValueError(f"{name}: test inputs have shape {test[0].shape[1:]}, training {x.shape[1:]}")
    return Dataset(x, y, k, name, source, test, None if classes is None else tuple(str(c) for c in classes))


def regression_set(x, y, name: str, source: str) -> Dataset:
    """A regression :class:`Dataset`: float64 inputs ``[n, ...]`` and targets ``[n]``."""
    x = np.asarray(x, np.float64)
    y = np.asarray(y, np.float64)
    if y.ndim != 1 or x.shape[:1] != y.shape:
        raise ValueError(f"{name}: need x [n, ...] and y [n]; got x {x.shape} and y {y.shape}")
    return Dataset(x, y, None, name, source)


def encode_labels(values, name: str) -> tuple[np.ndarray, tuple[str, ...]]:
    """Map arbitrary label values to ``0 .. K-1`` in sorted order; the values become the class names."""
    values = np.asarray(values)
    if values.dtype.kind == "f" and np.all(np.isfinite(values)) and np.all(values == np.round(values)):
        values = values.astype(np.int64)  # 1.0, 2.0, ... written by text formats
    if values.dtype.kind == "f":
        raise ValueError(f"{name}: the target has non-integer numbers (e.g. {values[values != np.round(values)][:3]});"
                         " classification needs discrete labels")
    if values.dtype.kind == "O":
        values = values.astype(str)
    classes, y = np.unique(values, return_inverse=True)
    return y.astype(np.int32), tuple(str(c) for c in classes)
