"""A practitioner's data and model in a run config: the ``[data]`` and ``[model]`` sections.

Example (three sites, one CSV file each, in the config file's folder)::

    [data]
    files = ["site_a.csv", "site_b.csv", "site_c.csv"]   # or file = "all.csv" / builtin = "breast-cancer"
    target = "label"                                      # plus partition = {kind = "dirichlet", ...}
    classes = [0, 1]
    test_fraction = 0.2
    standardise = true                                    # features, and a regression target

    [model]
    name = "logistic"                                     # or "mypackage.models:build"
    prior_scale = 1.0

:func:`load_data` reads every client with :mod:`fedmcmc.data.local` (each client's own file, its
own held-out part, standardisation from moments aggregated in client order, never pooled rows:
the features, and a regression target ``y' = (y - m_y) / s_y`` too) and records what it did in
:class:`Inputs`. The model sees the standardised target; the held-out targets stay in their own
units, for outputs read in them (:func:`in_target_units`). :func:`model_from_config` builds the
``[model]``: a built-in of :data:`MODELS` or a ``"package.module:function"``; either is called with
the keywords it accepts among ``num_features``, ``num_classes``, ``input_shape`` and
``target_scale`` (``s_y``, 1 without target standardisation: from the data) plus the section's
other keys, and ``temperature`` tempers the result (:func:`fedmcmc.models.tempered`).
A user's module is looked up in the config file's folder first, then on ``sys.path`` (e.g.
``PYTHONPATH``); like any import, once per process (a second config naming another file of the
same module name gets the first).
"""

from __future__ import annotations

import importlib
import inspect
import math
import sys
from typing import Any, Callable, NamedTuple

import numpy as np

from fedmcmc.core.base import Model
from fedmcmc.data import local
from fedmcmc.data.federated import FederatedData, from_clients
from fedmcmc.models import (lenet5, linear_regression, linear_regression_unknown_noise, logistic_regression, mlp,
                            multinomial_logistic_regression, tempered, with_intercept, with_target_scaling)

#: The keys a ``[data]`` section may set.
DATA_KEYS = {"files", "file", "builtin", "partition", "format", "target", "delimiter", "header", "drop",
             "num_features", "task", "classes", "test_fraction", "standardise", "seed"}
#: What the data supplies to a model builder that asks for it.
_SUPPLIED = ("num_features", "num_classes", "input_shape", "target_scale")


class Inputs(NamedTuple):
    """What a run's data were, for outputs and for rebuilding the model (``results.json["inputs"]``).

    Attributes
    ----------
    task
        ``"classification"`` or ``"regression"``.
    num_classes
        Number of classes (``len(classes)`` when declared, else the largest label + 1); None
        for regression.
    feature_names
        The CSV feature columns, or None.
    class_names
        The declared ``classes`` as text, or None.
    scaling
        ``{"mean": [...], "scale": [...]}`` applied to every client's inputs, or None.
    clients
        One ``{source, n_train, n_test}`` per client, in client order.
    input_shape
        The shape of one input (``[F]``, or ``[H, W]`` for images).
    target_scaling
        ``{"mean": m_y, "scale": s_y}`` applied to a regression target (the model sees
        ``(y - m_y) / s_y``), or None.
    """

    task: str
    num_classes: int | None
    feature_names: list[str] | None
    class_names: list[str] | None
    scaling: dict | None
    clients: tuple[dict, ...]
    input_shape: list[int]
    target_scaling: dict | None = None


class ClientSummary(NamedTuple):
    """What one client tells the server about its data (no row): the Flower nodes' ``hello``.

    Attributes
    ----------
    source
        Where its rows came from (a file).
    n_train, n_test
        Rows of its training and held-out parts.
    moments
        :class:`~fedmcmc.data.local.Moments` of its training inputs (None without standardisation).
    num_labels
        Its largest class label + 1 (None for regression).
    feature_names
        Its CSV feature columns, or None.
    input_shape
        The shape of one input.
    target_moments
        :class:`~fedmcmc.data.local.Moments` of its training targets (regression with
        standardisation; else None).
    """

    source: str
    n_train: int
    n_test: int
    moments: local.Moments | None
    num_labels: int | None
    feature_names: list[str] | None
    input_shape: list[int]
    target_moments: local.Moments | None = None


def _task(section: dict) -> str:
    task = section.get("task", "classification")
    if task not in ("classification", "regression"):
        raise ValueError(f'[data] task must be "classification" or "regression" (got {task!r})')
    if task == "regression" and "classes" in section:
        raise ValueError("[data] classes is for classification; leave it out for task = \"regression\"")
    return task


def split_local(section: dict, index: int, data: local.LocalData):
    """``(train, test, summary)`` of client ``index``: its own held-out split and its
    :class:`ClientSummary` (what a client does alone, on a Flower node or in the simulator)."""
    task, standardise = _task(section), section.get("standardise", True)
    if not isinstance(standardise, bool):
        raise ValueError(f"[data] standardise must be true or false (got {standardise!r})")
    train, test = local.split_client(section.get("seed", 0), index, data, section.get("test_fraction", 0.2))
    return train, test, ClientSummary(
        data.source, len(train.y), len(test.y), local.moments(train.x) if standardise else None,
        None if task == "regression" else 1 + int(data.y.max()),
        None if data.feature_names is None else list(data.feature_names), list(data.x.shape[1:]),
        local.moments(train.y) if standardise and task == "regression" else None)


def combine(section: dict, summaries) -> tuple[Inputs, local.Scaling | None]:
    """The run's :class:`Inputs` and feature scaling from the clients' summaries, in client order
    (the feature and target scalings from the moments by :func:`fedmcmc.data.local.pooled_scale`)."""
    task, classes, first = _task(section), section.get("classes"), summaries[0]
    scaling = None if first.moments is None else local.pooled_scale([s.moments for s in summaries])
    target = None if first.target_moments is None else local.pooled_scale([s.target_moments for s in summaries])
    k = None if task == "regression" else len(classes) if classes is not None else max(s.num_labels
                                                                                      for s in summaries)
    return Inputs(task, k, first.feature_names, None if classes is None else [str(c) for c in classes],
                  None if scaling is None else {"mean": scaling.mean.tolist(), "scale": scaling.scale.tolist()},
                  tuple({"source": s.source, "n_train": s.n_train, "n_test": s.n_test} for s in summaries),
                  first.input_shape,
                  None if target is None else {"mean": float(target.mean), "scale": float(target.scale)}), scaling


def load_data(section: dict, base_dir=None) -> tuple[FederatedData, tuple | None, Inputs]:
    """``(train, tests, inputs)`` of a ``[data]`` section: the clients' training parts as
    :class:`FederatedData` (``(x, y)`` per datum, a regression target standardised), their
    held-out ``(x, y)`` (the target in its own units; None when ``test_fraction = 0``), and the
    :class:`Inputs` record."""
    _task(section)
    parts = [split_local(section, i, c) for i, c in enumerate(local.read_clients(section, base_dir))]
    info, scaling = combine(section, [s for _, _, s in parts])
    target = local.scaling_from(info.target_scaling)
    train = from_clients([(local.apply_scaling(t.x, scaling), t.y if target is None else
                           local.apply_scaling(t.y, target)) for t, _, _ in parts])
    tests = None if section.get("test_fraction", 0.2) == 0 else tuple(held_out_part(t, info) for _, t, _ in parts)
    return train, tests, info


def held_out_part(test: local.LocalData, info: Inputs) -> tuple:
    """A client's held-out ``(x, y)`` as the run reads it: the inputs scaled as the training parts
    (``info.scaling``), the target in its own units."""
    return (local.apply_scaling(test.x, local.scaling_from(info.scaling)).astype(np.float32),
            test.y.astype(np.float32 if info.task == "regression" else np.int32))


def target_scale(inputs: Inputs) -> float:
    """``s_y``, the factor a regression target was divided by (1 without target standardisation)."""
    return 1.0 if inputs.target_scaling is None else float(inputs.target_scaling["scale"])


def in_target_units(model: Model, inputs: Inputs) -> Model:
    """The run's model (of the standardised target) as a model of the target in its own units
    (:func:`fedmcmc.models.with_target_scaling`); the model itself without target standardisation."""
    t = inputs.target_scaling
    return model if t is None else with_target_scaling(model, t["mean"], t["scale"])


# --------------------------------------------------------------------------- models

def _linear(num_features: int, noise_scale: float | str = "unknown", prior_scale: float = 1.0,
            intercept: bool = True, target_scale: float = 1.0) -> Model:
    """Bayesian linear regression, Gaussian noise: ``noise_scale = "unknown"`` samples ``log sigma``
    too (the last coordinate, prior N(0, 1) in the units the model sees), a number is the known
    noise in the target's own units (regression)."""
    if noise_scale == "unknown":
        model = linear_regression_unknown_noise(num_features + intercept, prior_scale)
    elif isinstance(noise_scale, (int, float)) and not isinstance(noise_scale, bool) and noise_scale > 0:
        model = linear_regression(num_features + intercept, noise_scale / target_scale, prior_scale)
    else:
        raise ValueError(f'[model] noise_scale must be "unknown" or a number > 0 in the target\'s units '
                         f"(got {noise_scale!r})")
    return with_intercept(model) if intercept else model


def _logistic(num_features: int, num_classes: int, prior_scale: float = 1.0, intercept: bool = True) -> Model:
    """Bayesian logistic regression (two classes)."""
    if num_classes != 2:
        raise ValueError(f'[model] "logistic" is for two classes (the data have {num_classes}); use "softmax"')
    model = logistic_regression(num_features + intercept, prior_scale)
    return with_intercept(model) if intercept else model


def _mlp(num_features: int, num_classes: int, hidden=(100,), activation: str = "relu",
         prior_scale: float = 1.0) -> Model:
    """A Bayesian multilayer perceptron with ``hidden = [..]`` layer widths (classification)."""
    return mlp(num_features, tuple(hidden), num_classes, activation, prior_scale)


#: ``[model] name`` -> ``(builder, task)``; a builder's keyword arguments are the section's keys.
MODELS: dict[str, tuple[Callable[..., Model], str]] = {
    "linear": (_linear, "regression"),
    "logistic": (_logistic, "classification"),
    "softmax": (multinomial_logistic_regression, "classification"),
    "mlp": (_mlp, "classification"),
    "lenet5": (lenet5, "classification"),
}


def _user_builder(name: str, base_dir) -> Callable[..., Model]:
    """The function of ``"package.module:function"``, imported from ``base_dir`` or ``sys.path``."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise ValueError(f"unknown model {name!r}; choose one of {list(MODELS)} or give your own as "
                         '"package.module:function"')
    added = base_dir is not None and str(base_dir) not in sys.path
    if added:
        sys.path.insert(0, str(base_dir))
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"[model] {name!r}: cannot import {module_name!r} ({err}); put {module_name}.py next to "
                         "the config file or its package on PYTHONPATH") from None
    finally:
        if added:
            sys.path.remove(str(base_dir))
    builder = getattr(module, attr, None)
    if not callable(builder):
        raise ValueError(f"[model] {name!r}: module {module_name!r} ({module.__file__}) has no function {attr!r}; "
                         "define it there or fix the name")
    return builder


def builder_keys(builder: Callable) -> tuple[set[str], bool]:
    """The ``[model]`` keys a builder takes (its parameters but those the data supply), and
    whether it takes any keyword (``**kwargs``)."""
    params = inspect.signature(builder).parameters
    open_ = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return {k for k, p in params.items() if k not in _SUPPLIED and p.kind is not p.VAR_KEYWORD}, open_


def resolve_builder(section: dict, base_dir=None) -> tuple[Callable[..., Model], str | None]:
    """``(builder, task)`` of a ``[model]`` section (task None for a user's function), its keys checked."""
    name = section.get("name")
    if not isinstance(name, str):
        raise ValueError(f'[model] needs name = one of {list(MODELS)} or "package.module:function"')
    builder, task = MODELS[name] if name in MODELS else (_user_builder(name, base_dir), None)
    keys, open_ = builder_keys(builder)
    unknown = set(section) - {"name", "temperature"} - keys
    if unknown and not open_:
        raise ValueError(f"unknown key(s) {sorted(unknown)} in [model] for {name!r}; allowed: "
                         f"{sorted(keys | {'name', 'temperature'})}")
    return builder, task


def model_from_config(cfg: dict, inputs: Inputs, base_dir=None) -> Model:
    """The ``[model]`` of ``cfg`` for data described by ``inputs``, tempered by ``temperature``."""
    section = cfg["model"]
    builder, task = resolve_builder(section, base_dir)
    if task is not None and task != inputs.task:
        raise ValueError(f"[model] {section['name']!r} is a {task} model but [data] task = {inputs.task!r}; "
                         f"choose one of {[k for k, (_, t) in MODELS.items() if t == inputs.task]}")
    supplied = {"num_features": math.prod(inputs.input_shape), "num_classes": inputs.num_classes,
                "input_shape": tuple(inputs.input_shape), "target_scale": target_scale(inputs)}
    params = inspect.signature(builder).parameters
    kwargs: dict[str, Any] = {k: v for k, v in supplied.items() if k in params}
    kwargs.update({k: v for k, v in section.items() if k not in ("name", "temperature")})
    missing = [k for k, p in params.items() if p.default is p.empty and k not in kwargs
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        raise ValueError(f"[model] {section['name']!r} needs {missing}; set them in [model] (the data supply only "
                         f"{list(_SUPPLIED)})")
    model = builder(**kwargs)
    if not isinstance(model, Model):
        raise ValueError(f"[model] {section['name']!r} returned {type(model).__name__}, not a fedmcmc.Model; "
                         "return fedmcmc.Model(log_likelihood, log_prior, dim, name, predict)")
    return tempered(model, section.get("temperature", 1.0))
