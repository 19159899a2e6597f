"""One client's own data, read and checked where it lives: the ``[data]`` section of a run config.

A Flower node holds one client's file and nothing else, and the simulator must see exactly what
the nodes see; so every step here is per client: :func:`read_client` reads one client's file
(CSV, NPZ, LIBSVM, LEAF JSON or IDX, through :mod:`fedmcmc.data.files`) into a checked
:class:`LocalData`, :func:`split_client` holds out the client's own test part with a key from the
run's seed and the client's index, and feature standardisation needs only what a client can share:
:func:`moments` (count, sum and sum of squares, float64), combined by :func:`pooled_scale` in client
order into the pooled mean and standard deviation, applied by :func:`apply_scaling`. No row leaves
its client. :func:`read_clients` gives the simulator every client of a ``[data]`` section: one file
per client, one file split by a partitioner of :mod:`fedmcmc.data.partition`, a built-in set of
:data:`fedmcmc.data.DATASETS`, or LEAF JSON with its natural partition by user.

Labels: with ``classes = [...]`` declared, a label is the position of its value in that list
(numbers compare by value, so ``1`` and ``1.0`` are the same class); without it, labels must be
class indices ``0, 1, ...``. A regression target (``task = "regression"``) is any finite number.

Every refusal is one line naming the file, the row and the column, and the fix.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from fedmcmc.data import files, partition
from fedmcmc.data.builtin import load_dataset

#: File formats, from the suffix unless ``format`` is given.
FORMATS = {".csv": "csv", ".npz": "npz", ".svm": "libsvm", ".libsvm": "libsvm",
           ".json": "leaf"}
#: Partitioners a ``partition = {kind = ...}`` may name; those marked True deal by label.
PARTITIONS = {"iid": (partition.iid, False), "unbalanced": (partition.unbalanced, False),
              "dirichlet": (partition.dirichlet, True), "dominant_label": (partition.dominant_label, True),
              "beta_binary": (partition.beta_binary, True)}


class LocalData(NamedTuple):
    """One client's data, read and checked (not :class:`fedmcmc.core.base.ClientData`, the padded
    view a sampler sees).

    Attributes
    ----------
    x
        Inputs ``[n, ...]`` (float64), every value finite.
    y
        Class indices (int32) or regression targets (float64) ``[n]``.
    source
        Where the rows came from (a file; ``file#user`` for a LEAF user).
    feature_names
        The CSV header's feature columns; None for other formats.
    """

    x: np.ndarray
    y: np.ndarray
    source: str
    feature_names: tuple[str, ...] | None = None


class Moments(NamedTuple):
    """What a client shares for standardisation: its row count and the per-feature sum and sum
    of squares of its inputs (float64, shape of one input)."""

    count: int
    total: np.ndarray
    total_sq: np.ndarray


class Scaling(NamedTuple):
    """Per-feature ``mean`` and ``scale`` (float64): inputs become ``(x - mean) / scale``."""

    mean: np.ndarray
    scale: np.ndarray


class _Raw(NamedTuple):
    """A file's numbers before the label check: inputs, labels as written, and how to name a place."""
    x: np.ndarray
    labels: np.ndarray
    feature_names: tuple[str, ...] | None
    row: Callable[[int], str]
    column: Callable[[int], str]


# --------------------------------------------------------------------------- reading one client

def resolve(path, base_dir) -> Path:
    """``path`` relative to ``base_dir`` (the config file's folder) unless absolute."""
    path = Path(os.path.expanduser(str(path)))
    return path if path.is_absolute() or base_dir is None else Path(base_dir) / path


def file_format(section: dict, source) -> str:
    """The format of one source: ``section["format"]``, else ``"idx"`` for ``{images, labels}``,
    else from the file's suffix (:data:`FORMATS`)."""
    given = section.get("format")
    if isinstance(source, dict):
        if set(source) != {"images", "labels"}:
            raise ValueError(f"an IDX source is {{images = ..., labels = ...}} (got keys {sorted(source)})")
        return "idx"
    if given is not None:
        if given not in set(FORMATS.values()) | {"idx"}:
            raise ValueError(f"[data] format must be one of {sorted(set(FORMATS.values()))} (got {given!r}); for IDX "
                             "give file = {images = ..., labels = ...}")
        return given
    suffix = Path(str(source).removesuffix(".gz").removesuffix(".bz2")).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"cannot tell the format of {source} from its suffix; name it: format = "
                         f"{sorted(set(FORMATS.values()))}")
    return FORMATS[suffix]


def _csv(section: dict, path: Path) -> _Raw:
    if "target" not in section:
        raise ValueError(f"{path}: CSV data needs target = NAME (or column index) in [data]")
    table = files.read_table(path, section["target"], delimiter=section.get("delimiter", ","),
                             header=section.get("header", True), drop=section.get("drop", ()))
    row = lambda i: files.where(path, i, table.first_line)  # noqa: E731
    column = lambda j: f"column {(table.feature_names + (table.target_name,))[j]!r}"  # noqa: E731
    return _Raw(table.x, table.target, table.feature_names, row, column)


def _npz(section: dict, path: Path) -> _Raw:
    if not path.is_file():
        raise FileNotFoundError(f"NPZ file {path} does not exist")
    with np.load(path, allow_pickle=False) as arrays:
        if "x" not in arrays or "y" not in arrays:
            raise ValueError(f"{path}: an NPZ file needs arrays 'x' (inputs) and 'y' (labels); it holds "
                             f"{sorted(arrays.files)}")
        x, y = arrays["x"], arrays["y"]
    if y.ndim != 1 or x.ndim < 2 or x.shape[:1] != y.shape:
        raise ValueError(f"{path}: need x [n, features...] and y [n]; got x {x.shape} and y {y.shape}")
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise ValueError(f"{path}: x must hold real numbers (got dtype {x.dtype})")
    return _Raw(x.astype(np.float64), y, None, lambda i: f"{path} row {i} (x[{i}])", lambda j: f"column {j}")


def _libsvm(section: dict, path: Path) -> _Raw:
    x, labels = files.read_libsvm(path, section.get("num_features"), zero_based=False)
    return _Raw(x, labels, None, lambda i: f"{path} row {i + 1} (line {i + 1})", lambda j: f"feature {j + 1}")


def _idx(section: dict, source: dict, base_dir) -> _Raw:
    images, labels = resolve(source["images"], base_dir), resolve(source["labels"], base_dir)
    d = files.load_idx(images, labels)
    return _Raw(d.x.astype(np.float64), d.y, None, lambda i: f"{images} item {i}", lambda j: f"pixel {j}")


def _leaf(section: dict, path: Path) -> list[tuple[str, _Raw]]:
    leaf = files.load_leaf_json(path)
    return [(f"{path}#{user}", _Raw(x.astype(np.float64), y, None,
                                    lambda i, u=user: f"{path} user {u!r} row {i}", lambda j: f"feature {j}"))
            for user, (x, y) in zip(leaf.users, leaf.clients)]


def class_key(value) -> str:
    """A label value as a class key: numbers by value (``1``, ``1.0`` and ``"1"`` alike), else the text."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value).strip()
    return str(int(number)) if np.isfinite(number) and number == int(number) else repr(number)


def _labels(section: dict, raw: _Raw) -> np.ndarray:
    """Class indices or regression targets of ``raw``'s labels, refusing the first bad one."""
    labels = np.asarray(raw.labels, dtype=object).ravel()
    column = raw.column(len(raw.feature_names)) if raw.feature_names is not None else "label"
    if section.get("task", "classification") == "regression":
        for i, v in enumerate(labels):
            try:
                ok = np.isfinite(float(v))
            except (TypeError, ValueError):
                ok = False
            if not ok:
                raise ValueError(f"{raw.row(i)}, {column}: target {v!r} is not a finite number; fix or remove the row")
        return labels.astype(np.float64)
    classes = section.get("classes")
    if classes is not None:
        index = {class_key(c): k for k, c in enumerate(classes)}
        for i, v in enumerate(labels):
            if class_key(v) not in index:
                raise ValueError(f"{raw.row(i)}, {column}: label {v!r} is not among classes = {list(classes)}; "
                                 "fix the row or add the class")
        return np.asarray([index[class_key(v)] for v in labels], np.int32)
    for i, v in enumerate(labels):
        key = class_key(v)
        if not key.isdigit():
            raise ValueError(f"{raw.row(i)}, {column}: label {v!r} is not a class index 0, 1, ...; declare "
                             "classes = [...] in [data] to name the classes")
    return np.asarray([int(class_key(v)) for v in labels], np.int32)


def _checked(section: dict, raw: _Raw, source: str) -> LocalData:
    if raw.x.shape[0] == 0:
        raise ValueError(f"{source} holds no data rows; give this client some data or leave it out")
    bad = np.argwhere(~np.isfinite(raw.x.reshape(raw.x.shape[0], -1)))
    if len(bad):
        i, j = (int(v) for v in bad[0])
        raise ValueError(f"{raw.row(i)}, {raw.column(j)}: {raw.x.reshape(len(raw.x), -1)[i, j]} is not a finite "
                         "number; fix or remove the row")
    return LocalData(raw.x, _labels(section, raw), source, raw.feature_names)


def read_client(section: dict, source, base_dir=None) -> LocalData:
    """Read and check one client's data.

    Parameters
    ----------
    section
        The ``[data]`` section (``format``, ``target``, ``delimiter``, ``header``, ``drop``,
        ``task``, ``classes``, ``num_features`` for LIBSVM).
    source
        A file path, ``{images = ..., labels = ...}`` for IDX, or ``{file = ..., user = ...}``
        for one user of a LEAF JSON file (a LEAF file of one user needs no ``user``).
    base_dir
        The folder relative paths start from (the config file's folder).

    Raises
    ------
    ValueError
        One line naming the file, the row and the column: missing target column, a value
        that is not a finite number, a label outside ``classes``, an empty client.
    FileNotFoundError
        No such file.
    """
    if isinstance(source, dict) and "user" in source:
        path = resolve(source.get("file"), base_dir)
        users = dict(_leaf(section, path))
        name = f"{path}#{source['user']}"
        if name not in users:
            raise ValueError(f"{path} has no user {source['user']!r}; its users are "
                             f"{[u.split('#', 1)[1] for u in users]}")
        return _checked(section, users[name], name)
    fmt = file_format(section, source)
    if fmt == "idx":
        return _checked(section, _idx(section, source, base_dir), str(resolve(source["images"], base_dir)))
    path = resolve(source, base_dir)
    if fmt == "leaf":
        users = _leaf(section, path)
        if len(users) != 1:
            raise ValueError(f"{path} holds {len(users)} LEAF users; name one: {{file = ..., user = ...}}")
        return _checked(section, users[0][1], users[0][0])
    return _checked(section, {"csv": _csv, "npz": _npz, "libsvm": _libsvm}[fmt](section, path), str(path))


# --------------------------------------------------------------------------- several clients

def _partition(section: dict, data: LocalData) -> list[LocalData]:
    """``data`` dealt over clients by ``section["partition"]``, seeded by ``section["seed"]``."""
    spec = dict(section["partition"]) if isinstance(section["partition"], dict) else {}
    kind = spec.pop("kind", None)
    if kind not in PARTITIONS:
        raise ValueError(f"[data] partition needs kind = one of {list(PARTITIONS)} (got {kind!r})")
    fn, by_label = PARTITIONS[kind]
    if by_label and section.get("task", "classification") == "regression":
        raise ValueError(f"partition kind {kind!r} deals by class label; use iid or unbalanced for regression")
    allowed = list(inspect.signature(fn).parameters)[2:]
    unknown = set(spec) - set(allowed)
    if unknown or "num_clients" not in spec:
        raise ValueError(f"partition {kind!r} takes {allowed} (num_clients required); got {sorted(spec)}")
    parts = fn(int(section.get("seed", 0)), data.y if by_label else len(data.y), **spec)
    return [data._replace(x=data.x[p], y=data.y[p], source=f"{data.source} part {c}") for c, p in enumerate(parts)]


def read_clients(section: dict, base_dir=None) -> list[LocalData]:
    """Every client of a ``[data]`` section, in order: ``files`` (one client per file, or per
    user of a LEAF file), ``file`` (split by ``partition``; a LEAF file without one keeps its
    users) or ``builtin`` (a :data:`fedmcmc.data.DATASETS` name, split by ``partition``)."""
    given = [key for key in ("files", "file", "builtin") if key in section]
    if len(given) != 1:
        raise ValueError(f"[data] needs exactly one of files = [...], file = ... or builtin = ... (got {given})")
    if "files" in section:
        if "partition" in section:
            raise ValueError("[data] files = [...] gives one client per file; partition is for file or builtin")
        sources: Sequence[Any] = section["files"]
        if isinstance(sources, (str, dict)) or not sources:
            raise ValueError('[data] files must be a non-empty list, e.g. files = ["site_a.csv", "site_b.csv"]')
        clients = [c for s in sources for c in _expand(section, s, base_dir)]
    elif "file" in section:
        clients = _expand(section, section["file"], base_dir)
        if "partition" in section:
            clients = [_pooled(clients) if len(clients) > 1 else clients[0]]
    else:
        if "partition" not in section or "classes" in section:
            raise ValueError("[data] builtin = ... needs partition = {kind = ..., num_clients = ...} and takes no "
                             "classes (a built-in set's labels are class indices)")
        d = load_dataset(section["builtin"], task=section.get("task", "classification"))
        raw = _Raw(d.x.astype(np.float64), d.y, None, lambda i: f"{d.name} row {i}", lambda j: f"column {j}")
        clients = [_checked(section, raw, d.name)]
    if "partition" in section:
        clients = _partition(section, clients[0])
    _same_features(clients)
    return clients


def _expand(section: dict, source, base_dir) -> list[LocalData]:
    """The clients of one source: one, or a LEAF file's users (its natural partition)."""
    if not isinstance(source, dict) and file_format(section, source) == "leaf":
        path = resolve(source, base_dir)
        return [_checked(section, raw, name) for name, raw in _leaf(section, path)]
    return [read_client(section, source, base_dir)]


def _pooled(clients: list[LocalData]) -> LocalData:
    _same_features(clients)
    return LocalData(np.concatenate([c.x for c in clients]), np.concatenate([c.y for c in clients]),
                     clients[0].source.split("#")[0], clients[0].feature_names)


def _same_features(clients: list[LocalData]) -> None:
    """Refuse clients whose inputs differ in shape (or, for CSV, in column names)."""
    first = clients[0]
    for c in clients[1:]:
        if c.x.shape[1:] != first.x.shape[1:]:
            raise ValueError(f"{c.source} has inputs of shape {list(c.x.shape[1:])} but {first.source} has "
                             f"{list(first.x.shape[1:])}; every client needs the same features")
        if c.feature_names and first.feature_names and c.feature_names != first.feature_names:
            j = next(j for j, (a, b) in enumerate(zip(c.feature_names, first.feature_names)) if a != b)
            raise ValueError(f"{c.source} column {j + 1} is {c.feature_names[j]!r} but {first.source} has "
                             f"{first.feature_names[j]!r}; every client needs the same columns in the same order")


# --------------------------------------------------------------------------- split and standardisation

def split_client(seed: int, index: int, data: LocalData, test_fraction: float) -> tuple[LocalData, LocalData]:
    """``(train, test)`` of one client: ``round(test_fraction * n)`` rows of a permutation drawn from
    ``numpy.random.default_rng([seed, index])`` are held out, so every node draws its own split
    alone. ``test_fraction = 0`` holds out nothing (an empty test part)."""
    if isinstance(test_fraction, bool) or not 0 <= test_fraction < 1:
        raise ValueError(f"[data] test_fraction must lie in [0, 1) (got {test_fraction!r})")
    n = len(data.y)
    order = np.random.default_rng([int(seed), int(index)]).permutation(n)
    cut = int(round(test_fraction * n))
    if n - cut == 0 or (test_fraction > 0 and cut == 0):
        raise ValueError(f"{data.source}: {n} row(s) leave an empty {'training' if cut else 'test'} part with "
                         f"test_fraction = {test_fraction}; give this client more rows or change test_fraction")

    def part(idx):
        return data._replace(x=data.x[idx], y=data.y[idx])

    return part(order[cut:]), part(order[:cut])


def moments(x) -> Moments:
    """A client's :class:`Moments`: row count, per-feature sum and sum of squares in float64."""
    a = np.asarray(x, np.float64)
    return Moments(int(a.shape[0]), a.sum(axis=0), (a * a).sum(axis=0))


def pooled_scale(parts: Sequence[Moments]) -> Scaling:
    """The pooled mean and standard deviation (``ddof = 0``) from the clients' moments, summed in
    client order. A feature whose variance is below ``1e-12`` of its mean square is constant up
    to rounding: scale 1."""
    count, total, total_sq = 0, 0.0, 0.0
    for m in parts:
        count, total, total_sq = count + m.count, total + m.total, total_sq + m.total_sq
    if count == 0:
        raise ValueError("standardisation needs at least one row")
    mean = np.asarray(total, np.float64) / count
    second = np.asarray(total_sq, np.float64) / count
    var = second - mean**2
    constant = var <= 1e-12 * np.maximum(second, np.finfo(np.float64).tiny)
    return Scaling(mean, np.where(constant, 1.0, np.sqrt(np.where(constant, 1.0, var))))


def scaling_from(record: dict | None) -> Scaling | None:
    """The :class:`Scaling` of a run's record (``{"mean": [...], "scale": [...]}``, as
    ``results.json["inputs"]["scaling"]`` holds it), or None."""
    return None if not record else Scaling(np.asarray(record["mean"], np.float64), np.asarray(record["scale"], np.float64))


def apply_scaling(x, scaling: Scaling | None) -> np.ndarray:
    """``(x - mean) / scale`` in float64 (``x`` as float64 when ``scaling`` is None)."""
    x = np.asarray(x, np.float64)
    return x if scaling is None else (x - scaling.mean) / scaling.scale
