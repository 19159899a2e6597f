"""Non-IID partitions of a data set over clients, and the SYNTHETIC(alpha, beta) generator.

A partitioner is a pure function of an integer seed (``numpy.random.default_rng(seed)``)
and returns one sorted int64 index array per client; the arrays are disjoint. Those that
deal every point (:func:`iid`, :func:`unbalanced`, :func:`dirichlet`) cover ``0 .. n-1``;
:func:`dominant_label` and :func:`beta_binary` take stated amounts and leave the rest out
(use the complement as a test pool if wanted). :func:`federate` turns a partition into
:class:`~fedmcmc.data.federated.FederatedData`; :func:`label_counts`, :func:`label_skew`,
:func:`summary` and :func:`plot_partition` describe it. :func:`shard_by_target` (regression
shards by the response) and :func:`synthetic` return the clients' data, one ``(x, y)`` per
client, rather than indices.

References
----------
- Hsu, Qi and Brown (2019), "Measuring the effects of non-identical data distribution for
  federated visual classification": per-class Dirichlet(alpha) proportions over clients.
- Vono, Plassier, Durmus, Dieuleveut and Moulines (2022), "QLSD: quantised Langevin
  stochastic dynamics for Bayesian federated learning", AISTATS, supplement S5.3: each
  client holds 40% of one label and 1% of each other.
- El Mekkaoui, Mesquita, Blomstedt and Kaski (2021), "Federated stochastic gradient
  Langevin dynamics", UAI, Section 5.3: clients' class-1 proportions ~ Beta(a, b).
- Li, Sahu, Zaheer, Sanjabi, Talwalkar and Smith (2020), "Federated optimization in
  heterogeneous networks" (FedProx), MLSys, Section 5.1: SYNTHETIC(alpha, beta); also in
  LEAF (Caldas et al. 2018).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from fedmcmc.data.federated import FederatedData, from_clients


def _check_clients(num_clients: int, n: int) -> None:
    if not 1 <= num_clients <= n:
        raise ValueError(f"num_clients must lie in [1, {n}] (the number of points); got {num_clients}")


def _labels(labels, num_classes: int | None = None) -> tuple[np.ndarray, int]:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array (got shape {labels.shape})")
    if not np.issubdtype(labels.dtype, np.integer):
        if np.issubdtype(labels.dtype, np.floating) and np.all(labels == np.round(labels)):
            labels = labels.astype(np.int64)
        else:
            raise ValueError(f"labels must be integer class indices (got dtype {labels.dtype})")
    if labels.min() < 0:
        raise ValueError("labels must be class indices >= 0")
    k = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if labels.max() >= k:
        raise ValueError(f"label {labels.max()} is out of range for num_classes={k}")
    return labels.astype(np.int64), k


def _sorted(parts) -> list[np.ndarray]:
    return [np.sort(np.asarray(p, np.int64)) for p in parts]


def _deal(pool: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    """Consecutive, disjoint blocks of ``pool`` of the given sizes (``sum(sizes) <= len(pool)``)."""
    ends = np.cumsum(sizes)
    return [pool[e - s:e] for s, e in zip(sizes, ends)]


# --------------------------------------------------------------------------- partitioners

def iid(seed: int, n: int, num_clients: int) -> list[np.ndarray]:
    """Shuffle ``0 .. n-1`` and cut it into ``num_clients`` parts whose sizes differ by at most one."""
    _check_clients(num_clients, n)
    order = np.random.default_rng(seed).permutation(n)
    return _sorted(np.array_split(order, num_clients))


def unbalanced(seed: int, n: int, num_clients: int, sigma: float) -> list[np.ndarray]:
    """IID points, lognormal client sizes: shares ``w_c ~ LogNormal(0, sigma^2)``, normalised.

    Each client gets one point, and the other ``n - num_clients`` are shared in proportion to
    ``w_c`` (largest-remainder rounding), so every client holds at least one point and
    ``sigma = 0`` gives equal sizes. Larger ``sigma`` makes sizes more unequal (the
    coefficient of variation of ``w`` is ``sqrt(exp(sigma^2) - 1)``).
    """
    _check_clients(num_clients, n)
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0 (got {sigma})")
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, sigma, num_clients)
    raw = w / w.sum() * (n - num_clients)
    sizes = np.floor(raw).astype(np.int64)
    short = (n - num_clients) - int(sizes.sum())
    sizes[np.argsort(-(raw - sizes), kind="stable")[:short]] += 1
    return _sorted(_deal(rng.permutation(n), sizes + 1))


def dirichlet(seed: int, labels, num_clients: int, alpha: float, min_size: int = 1,
              num_classes: int | None = None, max_tries: int = 1000) -> list[np.ndarray]:
    """Label skew by per-class Dirichlet proportions (Hsu et al. 2019).

    For each class ``k`` draw ``p_k ~ Dirichlet(alpha 1_J)`` over the ``J`` clients and deal
    the class's shuffled points in consecutive blocks of ``floor(cumsum(p_k) n_k)``. Small
    ``alpha`` concentrates each class on few clients (strong skew); large ``alpha`` tends to
    IID. The whole draw is repeated until every client holds at least ``min_size`` points
    (``FederatedData`` needs >= 1; the code of Wang et al. 2020 (FedMA) uses 10).

    Returns a partition covering every point.
    """
    labels, k = _labels(labels, num_classes)
    _check_clients(num_clients, labels.size)
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (got {alpha})")
    if min_size * num_clients > labels.size:
        raise ValueError(f"min_size={min_size} x {num_clients} clients exceeds the {labels.size} points")
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in range(k)]
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            if idx.size == 0:
                continue
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            cuts = np.floor(np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for c, block in enumerate(np.split(rng.permutation(idx), cuts)):
                parts[c].append(block)
        out = [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
        if min(len(p) for p in out) >= min_size:
            return _sorted(out)
    raise ValueError(f"no Dirichlet(alpha={alpha}) draw in {max_tries} tries gave every one of {num_clients} clients "
                     f">= {min_size} points; use a larger alpha, fewer clients or a smaller min_size")


def dominant_label(seed: int, labels, num_clients: int, dominant: float = 0.4, other: float = 0.01,
                   num_classes: int | None = None) -> list[np.ndarray]:
    """Client ``c`` holds a share ``dominant`` of label ``c mod K`` and ``other`` of each other label.

    The setting of QLSD (Vono et al. 2022, supplement S5.3: "each client holds 40% of one
    label and 1% of each other"). Shares are of each label's pool: client ``c`` gets exactly
    ``floor(f n_k)`` points of label ``k`` (``f`` = ``dominant`` or ``other``), disjoint
    across clients; points left over belong to no client.

    Raises
    ------
    ValueError
        When the shares ask more than a label holds, ``dominant * #{c : c mod K = k} +
        other * (J - #{...}) > 1``, or a client would be empty.
    """
    labels, k = _labels(labels, num_classes)
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1 (got {num_clients})")
    if not (0 <= dominant <= 1 and 0 <= other <= 1):
        raise ValueError(f"dominant and other are shares in [0, 1] (got {dominant}, {other})")
    owner = np.arange(num_clients) % k
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for label in range(k):
        n_dom = int(np.sum(owner == label))
        asked = dominant * n_dom + other * (num_clients - n_dom)
        if asked > 1 + 1e-12:
            raise ValueError(
                f"label {label}: {n_dom} clients x {dominant} + {num_clients - n_dom} clients x {other} = "
                f"{asked:.4g} > 1 of its points; lower dominant/other or use fewer clients")
        idx = np.flatnonzero(labels == label)
        shares = np.where(owner == label, dominant, other)
        sizes = np.floor(shares * idx.size + 1e-9).astype(np.int64)  # the 1e-9 guards 0.29 * 100 = 28.999...
        for c, block in enumerate(_deal(rng.permutation(idx), sizes)):
            parts[c].append(block)
    out = [np.concatenate(p) for p in parts]
    empty = [c for c, p in enumerate(out) if p.size == 0]
    if empty:
        raise ValueError(f"clients {empty} would hold no points; raise dominant/other or use more data")
    return _sorted(out)


def beta_binary(seed: int, labels, num_clients: int, a: float, b: float,
                size: int | None = None) -> list[np.ndarray]:
    """Binary label skew: client ``c``'s share of class 1 is ``p_c ~ Beta(a, b)`` (FSGLD, Section 5.3).

    Every client holds ``size`` points: ``round(p_c size)`` of class 1 and the rest of
    class 0, drawn without replacement (disjoint across clients). El Mekkaoui et al. (2021)
    contrast ``Beta(100, 100)`` (near IID, shares close to 1/2) with ``Beta(0.5, 0.5)``
    (most clients nearly one-class). The realised share ``k_c / size`` has the Beta mean and
    a variance larger by at most ``1 / (4 size^2)`` (about ``1 / (12 size^2)`` for a
    smooth Beta density) from the rounding.

    ``size`` defaults to ``min(n_0, n_1) // num_clients``, which always fits; a larger one
    raises ValueError when the draw needs more points of a class than there are.
    """
    labels, k = _labels(labels)
    if k > 2:
        raise ValueError(f"beta_binary needs labels in {{0, 1}} (got labels up to {k - 1})")
    if not (a > 0 and b > 0):
        raise ValueError(f"Beta parameters must be > 0 (got a={a}, b={b})")
    pools = [np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)]
    if size is None:
        size = min(p.size for p in pools) // num_clients
        if size < 1:
            raise ValueError(f"{num_clients} clients cannot each get a point of both classes "
                             f"({pools[0].size} of class 0, {pools[1].size} of class 1); give size= or fewer clients")
    if num_clients < 1 or size < 1:
        raise ValueError(f"num_clients and size must be >= 1 (got {num_clients}, {size})")
    rng = np.random.default_rng(seed)
    share = rng.beta(a, b, num_clients)
    ones = np.rint(share * size).astype(np.int64)
    need = [int((size - ones).sum()), int(ones.sum())]
    for cls in (0, 1):
        if need[cls] > pools[cls].size:
            raise ValueError(f"this draw needs {need[cls]} points of class {cls} but the labels hold "
                             f"{pools[cls].size}; use a smaller size (the default min(n0, n1) // num_clients "
                             "always fits)")
    zeros_blocks = _deal(rng.permutation(pools[0]), size - ones)
    ones_blocks = _deal(rng.permutation(pools[1]), ones)
    return _sorted(np.concatenate(z_o) for z_o in zip(zeros_blocks, ones_blocks))


def shard_by_target(x: np.ndarray, y: np.ndarray, num_shards: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Non-IID shards of a regression set, one ``(x, y)`` per shard: sort by the target and cut into
    ``num_shards`` contiguous, near-equal parts, so that each shard sees one range of the response
    (label skew for regression; El Mekkaoui et al. 2021, App. F.1). Points keep the target's order."""
    if not 1 <= num_shards <= len(y):
        raise ValueError(f"num_shards must lie in [1, {len(y)}] (got {num_shards})")
    order = np.argsort(y, kind="stable")
    return [(x[p], y[p]) for p in np.array_split(order, num_shards)]


# --------------------------------------------------------------------------- SYNTHETIC(alpha, beta)

def synthetic(seed: int, alpha: float, beta: float, num_clients: int = 30, dim: int = 60, num_classes: int = 10,
              *, iid: bool = False, sizes=None, size_mean: float = 4.0, size_sigma: float = 2.0,
              size_offset: int = 50) -> list[tuple[np.ndarray, np.ndarray]]:
    """SYNTHETIC(alpha, beta) of FedProx (Li et al. 2020, Section 5.1), one ``(x, y)`` per client.

    Client ``k`` draws ``u_k ~ N(0, alpha^2)``, ``B_k ~ N(0, beta^2)`` (``alpha`` and
    ``beta`` are standard deviations, as in the authors' generator), then
    ``W_k ~ N(u_k, 1)`` ``[dim, C]`` and ``b_k ~ N(u_k, 1)`` ``[C]`` entrywise,
    ``v_k ~ N(B_k, 1)`` ``[dim]``, and its points ``x ~ N(v_k, Sigma)``,
    ``Sigma = diag(j^{-1.2})``, labelled ``y = argmax softmax(x W_k + b_k)``. Client sizes
    are ``floor(LogNormal(size_mean, size_sigma)) + size_offset`` (FedProx: 4, 2, 50, with
    30 clients, ``dim = 60``, ``C = 10``), or ``sizes`` (an int or one per client).
    ``iid=True`` is FedProx's SYNTHETIC-IID: one ``W, b ~ N(0, 1)`` shared by all and
    ``v_k = 0`` (``alpha``, ``beta`` unused).

    Note: ``beta`` moves the clients' inputs apart (``Var v_kj = beta^2 + 1``). ``alpha``
    does not change the data at all: ``u_k`` is added to every class's logit alike,
    ``(x W_k + b_k)_j = u_k (sum_i x_i + 1) + (x E_k + e_k)_j``, and a softmax is blind to a
    common shift, so it only moves the clients' (unidentifiable) weights. We draw
    ``u_k = alpha z_k`` and ``W_k = u_k + E_k`` with ``z`` and ``E`` fixed by the seed, so a
    seed gives the same data for every ``alpha``. The label skew comes instead from the
    independent ``W_k`` (and ``v_k``): with the FedProx sizes the mean total-variation
    distance of the clients' label distributions from the pooled one (:func:`label_skew`)
    is about 0.8 for SYNTHETIC(1, 1), 0.75-0.8 for SYNTHETIC(0, 0), 0.02 for ``iid=True``,
    and about 0.35 for the binary ``dim = 2`` set below (measured over three seeds).

    Works for any ``num_classes >= 2`` and ``dim >= 1``; e.g. the QLSD memory study uses
    SYNTHETIC(1, 1) with ``dim = 2``, ``C = 2`` and 50 clients.
    """
    if num_clients < 1 or dim < 1 or num_classes < 2:
        raise ValueError(f"need num_clients >= 1, dim >= 1 and num_classes >= 2 "
                         f"(got {num_clients}, {dim}, {num_classes})")
    if alpha < 0 or beta < 0:
        raise ValueError(f"alpha and beta are standard deviations >= 0 (got {alpha}, {beta})")
    rng = np.random.default_rng(seed)
    if sizes is None:
        sizes = np.floor(rng.lognormal(size_mean, size_sigma, num_clients)).astype(np.int64) + int(size_offset)
    else:
        sizes = np.broadcast_to(np.asarray(sizes, np.int64), (num_clients,)).copy()
    if np.any(sizes < 1):
        raise ValueError(f"every client needs >= 1 point (got sizes {sizes.tolist()})")
    z_u = rng.standard_normal(num_clients)
    z_b = rng.standard_normal(num_clients)
    sd = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt of Sigma_jj = j^-1.2
    if iid:
        w_shared, b_shared = rng.standard_normal((dim, num_classes)), rng.standard_normal(num_classes)
    clients = []
    for c in range(num_clients):
        if iid:
            w, bias, v = w_shared, b_shared, np.zeros(dim)
        else:
            u = alpha * z_u[c]
            w = u + rng.standard_normal((dim, num_classes))
            bias = u + rng.standard_normal(num_classes)
            v = beta * z_b[c] + rng.standard_normal(dim)
        x = v + sd * rng.standard_normal((int(sizes[c]), dim))
        y = np.argmax(x @ w + bias, axis=1)  # softmax is monotone
        clients.append((x.astype(np.float32), y.astype(np.int32)))
    return clients


# --------------------------------------------------------------------------- use and describe

def federate(x, y, parts: Sequence[np.ndarray]) -> FederatedData:
    """``FederatedData`` with client ``c`` holding ``(x[parts[c]], y[parts[c]])``."""
    x, y = np.asarray(x), np.asarray(y)
    return from_clients([(x[p], y[p]) for p in parts])


def label_counts(labels, parts: Sequence[np.ndarray], num_classes: int | None = None) -> np.ndarray:
    """Matrix ``[clients, classes]`` of how many points of each class every client holds."""
    labels, k = _labels(labels, num_classes)
    return np.stack([np.bincount(labels[np.asarray(p, np.int64)], minlength=k) for p in parts]).astype(np.int64)


def label_skew(counts) -> float:
    """Mean total-variation distance between the clients' label distributions and the pooled one.

    0 when every client has the pooled class proportions; near ``1 - max_k pi_k`` when each
    client holds a single class. Empty clients are ignored.
    """
    counts = np.asarray(counts, np.float64)
    sizes = counts.sum(axis=1)
    keep = sizes > 0
    if not keep.any():
        raise ValueError("every client is empty")
    pooled = counts.sum(axis=0) / counts.sum()
    local = counts[keep] / sizes[keep, None]
    return float(0.5 * np.abs(local - pooled).sum(axis=1).mean())


def summary(labels, parts: Sequence[np.ndarray], num_classes: int | None = None) -> dict:
    """Sizes, label counts and heterogeneity of a partition, as a JSON-ready dict."""
    counts = label_counts(labels, parts, num_classes)
    sizes = counts.sum(axis=1)
    covered = np.unique(np.concatenate([np.asarray(p, np.int64) for p in parts])).size
    return {"num_clients": int(counts.shape[0]), "num_classes": int(counts.shape[1]),
            "num_points": int(sizes.sum()), "num_points_total": int(np.asarray(labels).size),
            "disjoint": bool(covered == sizes.sum()),
            "sizes": sizes.tolist(), "size_min": int(sizes.min()), "size_mean": float(sizes.mean()),
            "size_max": int(sizes.max()), "labels_per_client_mean": float((counts > 0).sum(axis=1).mean()),
            "label_skew_tv": label_skew(counts), "counts": counts.tolist()}


def plot_partition(path: str | os.PathLike, counts, class_names: Sequence[str] | None = None,
                   title: str | None = None) -> Path:
    """PNG of a ``[clients, classes]`` count matrix: stacked bars (<= 100 clients) or a heatmap."""
    from fedmcmc.core.figures import new_figure, save_figure

    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    counts = np.asarray(counts)
    if counts.ndim != 2:
        raise ValueError(f"counts must be a [clients, classes] matrix (got shape {counts.shape})")
    j, k = counts.shape
    names = list(class_names) if class_names is not None else [str(c) for c in range(k)]
    if j <= 100:
        fig, ax = new_figure(figsize=(max(6.0, 0.15 * j + 2), 4))
        cmap = colormaps["tab20" if k > 10 else "tab10"]
        bottom = np.zeros(j)
        for c in range(k):
            ax.bar(np.arange(j), counts[:, c], bottom=bottom, width=0.9, color=cmap(c % cmap.N), label=names[c])
            bottom += counts[:, c]
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("client")
        ax.set_ylabel("points")
        if k <= 26:
            ax.legend(title="class", fontsize="small", bbox_to_anchor=(1.01, 1), loc="upper left")
    else:
        fig, ax = new_figure(figsize=(8, 4))
        image = ax.imshow(counts.T, aspect="auto", interpolation="nearest", cmap="viridis")
        fig.colorbar(image, ax=ax, label="points")
        ax.set_xlabel("client")
        ax.set_ylabel("class")
    if title:
        ax.set_title(title)
    return save_figure(fig, path)
