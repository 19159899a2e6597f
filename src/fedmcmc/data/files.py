"""Readers of users' files: IDX, CSV, LIBSVM / svmlight and LEAF JSON.

:func:`read_idx` / :func:`load_idx` read the MNIST IDX format, :func:`read_table` /
:func:`load_csv` delimited text (a bad cell named by file, row and column), :func:`read_libsvm` /
:func:`load_libsvm` the sparse LIBSVM / svmlight text format (e.g. the covtype file of the LIBSVM
collection) and :func:`load_leaf_json` the per-user JSON of LEAF (Caldas et al.
2018) and of the FedProx synthetic sets, keeping the natural partition by user. Each returns
a classification :class:`~fedmcmc.data.dataset.Dataset` (LEAF: :class:`LeafData`); the ``read_*``
functions return the numbers as written, for :mod:`fedmcmc.data.local` to check and encode.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from fedmcmc.data.dataset import Dataset, classification_set, encode_labels

# IDX type codes (third byte of the magic number) -> big-endian numpy dtypes.
_IDX_DTYPES = {0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


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
    return classification_set(_idx_images(x), y, name, f"IDX files {images}, {labels}", num_classes, test)


# --------------------------------------------------------------------------- CSV and LIBSVM

class Table(NamedTuple):
    """A delimited text file read as numbers: what :func:`read_table` returns.

    Attributes
    ----------
    x
        The feature columns, float64 ``[n, F]``, every value a finite number.
    target
        The target column's values as written (stripped strings) ``[n]``, none empty.
    feature_names, target_name
        Column names (positions as strings when the file has no header).
    first_line
        The file's line number of row 0 (2 below a header, else 1), for messages.
    """

    x: np.ndarray
    target: np.ndarray
    feature_names: tuple[str, ...]
    target_name: str
    first_line: int


def where(path, row: int, first_line: int, column=None) -> str:
    """``"PATH row R (line L), column C"``: a cell's place for messages (``row`` counts from 0)."""
    place = f"{path} row {row + 1} (line {row + first_line})"
    return place if column is None else f"{place}, column {column!r}"


def numbers(cells: np.ndarray, path, columns: Sequence, first_line: int, fix: str) -> np.ndarray:
    """Text cells ``[n, m]`` as float64, refusing the first (row-major) cell that is empty, not a
    number, NaN or infinite with one line naming the file, row and column, and ``fix``."""
    import pandas as pd

    cells = np.asarray(cells, dtype=object)
    cells = cells[:, None] if cells.ndim == 1 else cells
    values = np.column_stack([pd.to_numeric(pd.Series(c, dtype=object), errors="coerce").to_numpy(np.float64)
                              for c in cells.T]) if cells.size else np.zeros(cells.shape)
    bad = np.argwhere(~np.isfinite(values))
    if len(bad):
        i, j = bad[0]
        text = str(cells[i, j]).strip()
        what = ("is empty (a missing value)" if text == "" else
                f"{text!r} is not a finite number" if text.lower().lstrip("+-") in ("nan", "inf", "infinity")
                else f"{text!r} is not a number")
        raise ValueError(f"{where(path, int(i), first_line, columns[j])}: {what}; {fix}")
    return values


def read_table(path: str | os.PathLike, target: str | int, *, delimiter: str = ",", header: bool = True,
               drop: Sequence[str | int] = ()) -> Table:
    """A delimited text file as numeric features and one target column (see :class:`Table`).

    ``target`` names the column, or gives its position (negative counts from the end);
    ``drop`` leaves columns out (identifiers, text). A bad cell (empty, not a number, NaN or
    infinite) is refused with one line naming the file, the row and the column.
    """
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CSV file {path} does not exist")
    try:
        frame = pd.read_csv(path, sep=delimiter, header=0 if header else None, skipinitialspace=True, dtype=str,
                            keep_default_na=False)
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
    first_line = 2 if header else 1
    x = numbers(frame[feature_cols].to_numpy(object), path, feature_cols, first_line,
                "fix the value, remove the row, or leave the column out with drop = [...]")
    y = np.asarray([str(v).strip() for v in frame[label]], dtype=object)
    empty = np.flatnonzero(y == "")
    if len(empty):
        raise ValueError(f"{where(path, int(empty[0]), first_line, label)}: the target is empty (a missing value); "
                         "fill it or remove the row")
    return Table(x, y, tuple(str(c) for c in feature_cols), str(label), first_line)


def load_csv(path: str | os.PathLike, target: str | int, *, delimiter: str = ",", header: bool = True,
             drop: Sequence[str | int] = (), name: str | None = None) -> Dataset:
    """A classification :class:`Dataset` from a delimited text file (:func:`read_table`).

    The target's values, numbers or strings, become class indices ``0 .. K-1`` in sorted
    order (numerically when they are all numbers); ``Dataset.classes`` keeps the original
    values. Errors name the file, the row and the column (:func:`read_table`).
    """
    table = read_table(path, target, delimiter=delimiter, header=header, drop=drop)
    labels = table.target
    try:
        labels = labels.astype(np.float64)
    except ValueError:
        pass
    y, classes = encode_labels(labels, str(path))
    return classification_set(table.x, y, name or Path(path).name,
                              f"CSV file {path} (target {table.target_name!r})", len(classes), classes=classes)


def read_libsvm(path: str | os.PathLike, num_features: int | None = None,
                zero_based: bool | str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """A LIBSVM / svmlight sparse text file as dense float64 inputs ``[n, F]`` and its labels
    ``[n]`` (float64, as written). See :func:`load_libsvm` for the format and arguments."""
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
    return x.toarray(), labels


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
    x, labels = read_libsvm(path, num_features, zero_based)
    y, classes = encode_labels(labels, str(path))
    return classification_set(x, y, name or Path(path).name, f"LIBSVM file {path}", len(classes), classes=classes)


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
        return classification_set(np.concatenate([x for x, _ in self.clients]),
                                  np.concatenate([y for _, y in self.clients]), name, self.source, self.num_classes)


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
        for u, x, y in _leaf_users(f):
            xs.setdefault(u, []).append(x)
            ys.setdefault(u, []).append(y)
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


def _leaf_users(f: Path) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """``(user, x float32, y int32)`` of every user with points in one LEAF JSON file, checked."""
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
    out = []
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
            out.append((str(u), x, y.astype(np.int32)))
    return out
