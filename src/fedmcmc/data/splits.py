"""Train/test splits whose scaling comes from the training part only, and transformations of a split.

:func:`split_and_standardise` holds out a test set (or keeps the one a set ships), scales the
inputs with statistics of the training part, and for a regression set also centres and scales
the target; the :class:`Split` records what was done. :func:`with_intercept` adds the column of
ones of a linear model's design; :func:`pca_project` projects the inputs on their top principal
axes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from fedmcmc.data.dataset import Dataset


class Split(NamedTuple):
    """A train/test split whose scaling comes from the training part only.

    Inputs: ``x_* = (x - shift) / scale``; ``mode`` says which statistics: ``"feature"``
    (per-feature mean and standard deviation, arrays of the input shape), ``"pixel"`` (one
    minimum and range for all values, so images land in [0, 1]) or ``"none"``. Targets: class
    indices of a classification set as they are; for a regression set (``num_classes`` None)
    ``y_* = (y - y_shift) / y_scale`` with the training mean and standard deviation, so a
    squared error times ``y_scale ** 2`` is in the original units.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int | None
    mode: str
    shift: Any
    scale: Any
    name: str
    source: str
    test_source: str
    y_shift: float = 0.0
    y_scale: float = 1.0

    def summary(self) -> dict:
        """Sizes, shapes, class counts (classification) and the scaling, for outputs."""
        k = self.num_classes
        out = {"name": self.name, "source": self.source, "test_source": self.test_source,
               "num_train": int(self.x_train.shape[0]), "num_test": int(self.x_test.shape[0]),
               "input_shape": list(self.x_train.shape[1:]), "num_classes": k}
        if k is not None:
            out["train_class_counts"] = np.bincount(self.y_train, minlength=k).tolist()
            out["test_class_counts"] = np.bincount(self.y_test, minlength=k).tolist()
        out.update(standardise=self.mode, shift=np.asarray(self.shift).tolist(), scale=np.asarray(self.scale).tolist())
        if k is None:
            out.update(y_shift=self.y_shift, y_scale=self.y_scale)
        return out


def _largest_remainder(quotas: np.ndarray, total: int) -> np.ndarray:
    """Integers ``floor(quotas)`` plus one for the largest remainders, summing to ``total``."""
    base = np.floor(quotas).astype(np.int64)
    extra = total - int(base.sum())
    base[np.argsort(-(quotas - base), kind="stable")[:extra]] += 1
    return base


def _mode(standardise: bool | str, x: np.ndarray) -> str:
    if standardise is True:
        mode = "pixel" if x.ndim >= 3 else "feature"
    elif standardise is False:
        mode = "none"
    else:
        mode = str(standardise)
    if mode not in ("pixel", "feature", "none"):
        raise ValueError(f"standardise must be True, False, 'pixel', 'feature' or 'none' (got {standardise!r})")
    return mode


def _hold_out(rng: np.random.Generator, dataset: Dataset, test_fraction: float,
              stratify: bool) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)`` of a random hold-out, stratified by class if asked (classification)."""
    y = dataset.y
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must lie in (0, 1) (got {test_fraction})")
    if stratify and dataset.num_classes is not None:
        sizes = np.bincount(y, minlength=dataset.num_classes)
        cuts = _largest_remainder(test_fraction * sizes, int(round(test_fraction * len(y))))
        test, train = [], []
        for k, cut in enumerate(cuts):
            idx = rng.permutation(np.flatnonzero(y == k))
            test.append(idx[:cut])
            train.append(idx[cut:])
        test, train = rng.permutation(np.concatenate(test)), rng.permutation(np.concatenate(train))
    else:
        order = rng.permutation(len(y))
        cut = int(round(test_fraction * len(y)))
        test, train = order[:cut], order[cut:]
    if len(test) == 0 or len(train) == 0:
        raise ValueError(f"test_fraction={test_fraction} leaves an empty part of {len(y)} points")
    return train, test


def _scaling(mode: str, x_tr: np.ndarray) -> tuple[Any, Any]:
    """``(shift, scale)`` of the inputs from the training inputs."""
    if mode == "feature":
        scale = x_tr.std(axis=0, dtype=np.float64)
        return x_tr.mean(axis=0, dtype=np.float64), np.where(scale > 0, scale, 1.0)
    if mode == "pixel":
        shift = float(x_tr.min())
        span = float(x_tr.max()) - shift
        return shift, span if span > 0 else 1.0
    return 0.0, 1.0


def split_and_standardise(dataset: Dataset, seed: int, test_fraction: float = 0.2,
                          standardise: bool | str = True, use_shipped_test: bool = True,
                          stratify: bool = True) -> Split:
    """Hold out a test set and scale the inputs (and a regression target) with training statistics.

    Parameters
    ----------
    dataset
        A :class:`~fedmcmc.data.dataset.Dataset`, classification or regression.
    seed
        Seed of the shuffle (``numpy.random.default_rng``).
    test_fraction
        Share held out when the set has no shipped test split (or ``use_shipped_test`` is
        False): ``round(test_fraction * n)`` points, the first of a random permutation.
    standardise
        ``True``: ``"pixel"`` for images (inputs with two or more axes), ``"feature"`` for
        tabular data. ``"pixel"``: ``(x - min) / (max - min)`` with the training minimum
        and maximum over all values; images already in [0, 1] with both extremes present are
        unchanged. ``"feature"``: per-feature ``(x - mean) / std`` (constant features get
        scale 1). ``False`` or ``"none"``: unchanged. A regression target is centred and
        scaled by its training mean and standard deviation unless ``"none"``.
    use_shipped_test
        Keep a set's own test split (Fashion-MNIST) rather than drawing one.
    stratify
        Classification sets: class ``k`` gives ``floor(test_fraction * n_k)`` or one more
        (largest remainders first) to the test part, so both parts keep the class proportions
        of the whole. A regression set is always held out at random.
    """
    mode = _mode(standardise, dataset.x)
    x, y = dataset.x, dataset.y
    rng = np.random.default_rng(seed)
    if dataset.test is not None and use_shipped_test:
        order = rng.permutation(len(y))
        x_tr, y_tr = x[order], y[order]
        x_te, y_te = dataset.test
        test_source = "shipped test split"
    else:
        train, test = _hold_out(rng, dataset, test_fraction, stratify)
        x_tr, y_tr, x_te, y_te = x[train], y[train], x[test], y[test]
        stratified = stratify and dataset.num_classes is not None
        test_source = (f"random {'stratified ' if stratified else ''}hold-out, test_fraction={test_fraction}, "
                       f"seed={seed}")
    shift, scale = _scaling(mode, x_tr)

    def apply(a):
        return ((a - shift) / scale).astype(x.dtype)

    kept = (dataset.num_classes, mode, shift, scale, dataset.name, dataset.source, test_source)
    if dataset.num_classes is not None:
        return Split(apply(x_tr), y_tr.astype(np.int32), apply(x_te), np.asarray(y_te, np.int32), *kept)
    y_shift, y_scale = (float(y_tr.mean()), float(y_tr.std())) if mode != "none" else (0.0, 1.0)
    y_scale = y_scale if y_scale > 0 else 1.0
    return Split(apply(x_tr), (y_tr - y_shift) / y_scale, apply(x_te), (y_te - y_shift) / y_scale, *kept,
                 y_shift, y_scale)


def with_intercept(split: Split) -> Split:
    """The split with a leading column of ones in its inputs ``[n, 1 + p]``: the intercept of a
    linear model's design (:func:`fedmcmc.models.linear_regression`)."""

    def design(a):
        return np.c_[np.ones(len(a)), a]

    return split._replace(x_train=design(split.x_train), x_test=design(split.x_test))


def pca_project(split: Split, num_components: int) -> Split:
    """Project the (flattened) inputs onto the top ``num_components`` principal axes of the
    training inputs, centred by the training mean (test inputs use the same mean and axes).

    The reduced inputs keep the principal variances (no whitening); ``name`` gains a
    ``-pca<m>`` suffix and ``source`` says what was done. Used to make cheap, smaller
    versions of image problems (e.g. the ``--quick`` setting of a reproduction).
    """
    x_tr = split.x_train.reshape(split.x_train.shape[0], -1).astype(np.float64)
    m = int(num_components)
    if not 1 <= m <= min(x_tr.shape):
        raise ValueError(f"num_components must lie in 1..{min(x_tr.shape)} for {x_tr.shape[0]} training points "
                         f"of {x_tr.shape[1]} features (got {num_components!r})")
    mean = x_tr.mean(axis=0)
    centred = x_tr - mean
    _, vectors = np.linalg.eigh(centred.T @ centred)  # ascending eigenvalues
    axes = vectors[:, ::-1][:, :m]

    def project(a):
        return ((a.reshape(a.shape[0], -1) - mean) @ axes).astype(np.float32)

    return split._replace(x_train=project(split.x_train), x_test=project(split.x_test),
                          name=f"{split.name}-pca{m}",
                          source=f"{split.source}; projected on the top {m} principal axes of the training inputs")
