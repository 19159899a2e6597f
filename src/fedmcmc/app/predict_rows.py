"""``fedmcmc predict RUN_DIR DATA.csv``: the posterior predictive of a finished run on new rows.

The run folder holds ``config.toml`` (the run's ``[data]`` and ``[model]``), ``results.json``
(whose ``inputs`` record the task, the feature names, the classes and the scaling of the
inputs) and ``posterior.nc`` (the stored draws). The model is rebuilt from the config
(:func:`fedmcmc.app.config.model_from_config`; a user's ``"module:function"`` is looked up in the
current folder, then on ``sys.path``), each row of ``DATA.csv`` is scaled as the training inputs
were, and every stored draw predicts it. The CSV has a header; its feature columns are the run's
(by name when the run's data had names, else every column but the target), in any order. Output,
one row per input row:

- classification: ``p_<class>`` for each class (the Bayesian model average
  :func:`~fedmcmc.evaluation.predict.predict_bma`), ``entropy`` (of that average, in nats) and
  ``predicted`` (the class of largest probability);
- regression: ``mean``, ``lower`` and ``upper``, the posterior predictive mean and central
  ``level`` interval of :func:`~fedmcmc.evaluation.regression.predictive_interval`, in the
  target's own units (a target the run standardised, ``inputs["target_scaling"]``, is scaled
  back: :func:`fedmcmc.models.with_target_scaling`).

When the target column is present it is not used to predict; it adds ``correct`` (0 or 1) or
``residual`` (target minus mean).
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Callable

import numpy as np

from fedmcmc.data import local
from fedmcmc.evaluation.classification import as_probs, entropy
from fedmcmc.evaluation.predict import predict_bma
from fedmcmc.evaluation.regression import predictive_interval
from fedmcmc.models.target import with_target_scaling
from fedmcmc.runtime import io

RUN_FILES = ("config.toml", "results.json", "posterior.nc")


def read_run(run_dir) -> tuple[dict, dict]:
    """``(config, inputs record)`` of a run folder, its files checked."""
    run_dir = Path(run_dir)
    for name in RUN_FILES:
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir} has no {name}; give the folder of a finished `fedmcmc run` "
                                    f"(it holds {', '.join(RUN_FILES)})")
    cfg = tomllib.loads((run_dir / "config.toml").read_text())
    record = json.loads((run_dir / "results.json").read_text()).get("inputs")
    if not record or "data" not in cfg:
        raise ValueError(f"{run_dir} is a run of a built-in [problem]; predict needs a run of [data] + [model]")
    return cfg, record


def _default_model(cfg: dict, record: dict):
    from fedmcmc.app.config import model_from_config
    from fedmcmc.app.inputs import Inputs

    return model_from_config(cfg, Inputs(**record), Path.cwd())


def read_rows(path, record: dict, target) -> tuple[np.ndarray, np.ndarray | None]:
    """``(x [n, F] float64, target values or None)`` of ``DATA.csv`` for a run with inputs ``record``."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} not found; give a CSV file with a header row")
    try:
        frame = pd.read_csv(path, skipinitialspace=True)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a readable CSV file ({str(err).splitlines()[0]})") from None
    names, label = _columns([str(c) for c in frame.columns], record, target, path)
    features = frame[names]
    bad = [c for c in names if not pd.api.types.is_numeric_dtype(features[c]) or not np.isfinite(features[c]).all()]
    if bad:
        raise ValueError(f"{path}: column(s) {bad[:5]} hold non-numeric, missing or infinite values; fix those rows")
    if len(frame) == 0:
        raise ValueError(f"{path} has no rows to predict")
    x = local.apply_scaling(features.to_numpy(np.float64), local.scaling_from(record.get("scaling")))
    return x.reshape((len(x), *record["input_shape"])), (None if label is None else frame[label].to_numpy())


def _columns(columns: list[str], record: dict, target, path) -> tuple[list[str], str | None]:
    """``(feature columns, target column or None)`` of a CSV header for a run with inputs ``record``."""
    width = int(np.prod(record["input_shape"]))
    named = record["feature_names"]
    others = [c for c in columns if c not in (named or ())]
    if isinstance(target, str):
        label = target if target in columns else None
    elif named:  # the target by position: the one column besides the features
        label = others[0] if len(others) == 1 else None
    else:
        label = columns[target] if len(columns) == width + 1 and -len(columns) <= target < len(columns) else None
    names = named or [c for c in columns if c != label]
    missing = [c for c in names if c not in columns]
    unknown = [c for c in others if c != label] if named else []
    if missing or unknown or len(names) != width:
        raise ValueError(f"{path} has {len(columns) - (label is not None)} feature column(s); the run's model takes "
                         f"{width}" + (f" named {named[:4]}..." if named else "")
                         + (f"; missing {missing[:5]}" if missing else "") + (f"; unknown {unknown[:5]}" if unknown else ""))
    return names, label


def _class_index(values, record: dict, path) -> np.ndarray:
    """Target values as class indices: by the declared class names, else integers ``0..K-1``."""
    names = record.get("class_names") or [str(k) for k in range(record["num_classes"])]
    index = {local.class_key(name): k for k, name in enumerate(names)}  # the training labels' keys
    unknown = sorted({local.class_key(v) for v in values} - set(index))
    if unknown:
        raise ValueError(f"{path}: target values {unknown[:5]} are not among the run's classes {list(index)}")
    return np.array([index[local.class_key(v)] for v in values])


def predict(run_dir, data, out=None, *, level: float = 0.94,
            build_model: Callable[[dict, dict], object] | None = None) -> Path:
    """Write the posterior predictive of every row of ``data`` as CSV (module docstring) and return its path.

    ``out`` defaults to ``RUN_DIR/predictions-<DATA stem>.csv``; ``build_model(cfg, inputs
    record)`` rebuilds the model (default: :func:`fedmcmc.app.config.model_from_config`).
    """
    import pandas as pd

    run_dir = Path(run_dir)
    cfg, record = read_run(run_dir)
    x, target = read_rows(data, record, cfg["data"].get("target", -1))
    model = (build_model or _default_model)(cfg, record)
    draws = io.read_draws(run_dir / "posterior.nc", model.layout)
    table = {}
    if record["task"] == "classification":
        probs = as_probs(predict_bma(model, draws, x.astype(np.float32)))  # [n] of a binary model: [n, 2]
        names = record.get("class_names") or [str(k) for k in range(probs.shape[1])]
        table.update({f"p_{name}": probs[:, k] for k, name in enumerate(names)})
        table.update(entropy=entropy(probs), predicted=[names[k] for k in np.argmax(probs, axis=1)])
        if target is not None:
            table["correct"] = (np.argmax(probs, axis=1) == _class_index(target, record, data)).astype(int)
    else:
        target_scaling = record.get("target_scaling")  # absent from the records of older runs
        if target_scaling is not None:
            model = with_target_scaling(model, target_scaling["mean"], target_scaling["scale"])
        pred = predictive_interval(model, draws, x.astype(np.float32), level)
        table.update(mean=pred.mean, lower=pred.lower, upper=pred.upper)
        if target is not None:
            table["residual"] = np.asarray(target, np.float64) - pred.mean
    out = Path(out) if out is not None else run_dir / f"predictions-{Path(data).stem}.csv"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    pd.DataFrame(table).to_csv(tmp, index=False)
    os.replace(tmp, out)
    return out
