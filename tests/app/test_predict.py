"""`fedmcmc predict RUN_DIR DATA.csv`: the Bayes average of the stored draws on rows scaled as the
run's inputs were, the regression interval, and one-line errors with exit code 2."""

import json

import numpy as np
import pandas as pd
import pytest

from fedmcmc import evaluation as ev
from fedmcmc.app import cli
from fedmcmc.app.predict_rows import predict
from fedmcmc.models import linear_regression, logistic_regression
from fedmcmc.runtime import io
from fedmcmc.runtime.records import SimulationResult

F = 4
NAMES = [f"f{i}" for i in range(F)]


def write_run(folder, task, draws, scaling, class_names=None, target_scaling=None):
    """A run folder as `fedmcmc run` leaves it: config.toml, results.json["inputs"], posterior.nc."""
    folder.mkdir()
    model = "logistic" if task == "classification" else "linear"
    (folder / "config.toml").write_text(f'[data]\nfiles = ["a.csv"]\ntarget = "label"\ntask = "{task}"\n\n'
                                        f'[model]\nname = "{model}"\nintercept = false\n')
    inputs = {"task": task, "num_classes": 2 if task == "classification" else None, "feature_names": NAMES,
              "class_names": class_names, "scaling": scaling, "clients": [{"source": "a.csv", "n_train": 9,
                                                                         "n_test": 3}], "input_shape": [F]}
    if target_scaling is not None:  # the records of runs before target standardisation have no such key
        inputs["target_scaling"] = target_scaling
    (folder / "results.json").write_text(json.dumps({"inputs": inputs}))
    c, n = draws.shape[:2]
    zeros = np.zeros((c, n), np.int64)
    res = SimulationResult(draws, np.arange(1, n + 1), zeros, zeros, zeros, None, zeros[:, 0], zeros[:, 0], n, 0, 1, 0.)
    io.write_posterior(folder / "posterior.nc", {"run": res}, names=NAMES)
    return folder


@pytest.fixture
def rows():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (12, F))
    scaling = {"mean": [3.0, 2.5, 3.5, 3.0], "scale": [2.0, 1.5, 2.5, 2.0]}
    return x, scaling, (x - np.array(scaling["mean"])) / np.array(scaling["scale"])


def test_probabilities_are_the_bayes_average_of_the_draws(tmp_path, rows):
    x, scaling, scaled = rows
    draws = np.random.default_rng(1).normal(0.5, 0.3, (2, 40, F)).astype(np.float32)
    run = write_run(tmp_path / "run", "classification", draws, scaling, class_names=["benign", "malignant"])
    model = logistic_regression(F)
    y = np.where(np.arange(12) % 3 == 0, "malignant", "benign")
    frame = pd.DataFrame(x, columns=NAMES)[NAMES[::-1]].assign(label=y)  # columns in another order
    frame.to_csv(tmp_path / "new.csv", index=False)
    out = predict(run, tmp_path / "new.csv", build_model=lambda cfg, inputs: model)
    got = pd.read_csv(out)
    probs = ev.bayes_average(ev.predict_draws(model, draws, scaled.astype(np.float32)))
    np.testing.assert_allclose(got[["p_benign", "p_malignant"]].to_numpy(), probs, rtol=1e-6)
    np.testing.assert_allclose(got["entropy"], ev.entropy(probs), rtol=1e-6)
    assert list(got["predicted"]) == [["benign", "malignant"][k] for k in probs.argmax(axis=1)]
    np.testing.assert_array_equal(got["correct"], probs.argmax(axis=1) == (y == "malignant"))
    frame.drop(columns="label").to_csv(tmp_path / "unlabelled.csv", index=False)
    unlabelled = pd.read_csv(predict(run, tmp_path / "unlabelled.csv", tmp_path / "p.csv",
                                     build_model=lambda cfg, inputs: model))
    assert "correct" not in unlabelled and np.allclose(unlabelled["p_benign"], got["p_benign"])


def test_regression_gives_the_predictive_interval_and_residuals(tmp_path, rows):
    x, scaling, scaled = rows
    draws = np.random.default_rng(2).normal(1.0, 0.1, (2, 30, F)).astype(np.float32)
    run = write_run(tmp_path / "run", "regression", draws, scaling)
    model = linear_regression(F, noise_scale=0.3)
    y = scaled @ np.ones(F)
    pd.DataFrame(x, columns=NAMES).assign(label=y).to_csv(tmp_path / "new.csv", index=False)
    got = pd.read_csv(predict(run, tmp_path / "new.csv", level=0.8, build_model=lambda cfg, inputs: model))
    expected = ev.predictive_interval(model, draws, scaled.astype(np.float32), level=0.8)
    for column, values in [("mean", expected.mean), ("lower", expected.lower), ("upper", expected.upper),
                           ("residual", y - expected.mean)]:
        np.testing.assert_allclose(got[column], values, rtol=1e-5, atol=1e-5)


def test_a_standardised_target_is_predicted_in_its_own_units(tmp_path, rows):
    """The run's model saw (y - 120) / 20: mean, interval and residual come back in y's units."""
    x, scaling, scaled = rows
    draws = np.random.default_rng(3).normal(0.2, 0.1, (2, 30, F)).astype(np.float32)
    run = write_run(tmp_path / "run", "regression", draws, scaling, target_scaling={"mean": 120.0, "scale": 20.0})
    model = linear_regression(F, noise_scale=0.3)
    y = 120.0 + 20.0 * scaled @ np.full(F, 0.2)
    pd.DataFrame(x, columns=NAMES).assign(label=y).to_csv(tmp_path / "new.csv", index=False)
    got = pd.read_csv(predict(run, tmp_path / "new.csv", level=0.8, build_model=lambda cfg, inputs: model))
    standardised = ev.predictive_interval(model, draws, scaled.astype(np.float32), level=0.8)
    for column, values in [("mean", standardised.mean), ("lower", standardised.lower), ("upper", standardised.upper)]:
        np.testing.assert_allclose(got[column], 120.0 + 20.0 * values, rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(got["residual"], y - got["mean"], atol=1e-3)


def _cli_error(capsys, *args):
    code = cli.main(["predict", *map(str, args)])
    return code, capsys.readouterr().err.strip().splitlines()


def test_bad_input_gives_one_line_and_exit_code_2(tmp_path, rows, capsys):
    x, scaling, _ = rows
    run = write_run(tmp_path / "run", "classification", np.zeros((2, 5, F), np.float32), scaling)
    pd.DataFrame(x[:, :3], columns=NAMES[:3]).to_csv(tmp_path / "narrow.csv", index=False)
    code, lines = _cli_error(capsys, run, tmp_path / "narrow.csv")
    assert code == 2 and len(lines) == 1 and "3 feature column(s); the run's model takes 4" in lines[0]
    assert "missing ['f3']" in lines[0]
    (run / "posterior.nc").unlink()
    code, lines = _cli_error(capsys, run, tmp_path / "narrow.csv")
    assert code == 2 and len(lines) == 1 and "has no posterior.nc" in lines[0]
    assert not list(run.glob("predictions*"))
