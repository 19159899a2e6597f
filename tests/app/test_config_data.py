"""`fedmcmc run` on a practitioner's own files and model: [data] and [model] in the run config."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from fedmcmc.app import config
from fedmcmc.app.cli import main
from fedmcmc.models import logistic_regression

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}

CONFIG = """
[data]
{data}
target = "label"
classes = [0, 1]
test_fraction = 0.2

[model]
{model}

[sampler]
name = "qlsd++"
step_size = 1e-3
batch_fraction = 0.2

[run]
seed = 0
num_chains = 2
num_iterations = 60
"""
THREE = 'files = ["site_a.csv", "site_b.csv", "site_c.csv"]'


@pytest.fixture(scope="module")
def frame():
    return load_breast_cancer(as_frame=True).frame.rename(columns={"target": "label"})


def write(folder, frame, data=THREE, model='name = "logistic"', parts=None):
    """Three hospitals: CSV files of different sizes and label balance, and the run config."""
    parts = parts or {"site_a.csv": frame[frame.label == 0].iloc[:120], "site_b.csv": frame.iloc[200:260],
                      "site_c.csv": frame[frame.label == 1].iloc[:150]}
    for name, part in parts.items():
        part.to_csv(folder / name, index=False)
    path = folder / "run.toml"
    path.write_text(CONFIG.format(data=data, model=model))
    return path


@pytest.mark.slow
def test_three_csv_files_run_end_to_end(tmp_path, frame):
    path = write(tmp_path, frame)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fedmcmc", "run", str(path), "--out", str(out), "--no-progress",
                           "--workers", "1"], capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert (out / "config.toml").read_text() == path.read_text()
    results = json.loads((out / "results.json").read_text())
    inputs = results["inputs"]
    assert [c["n_train"] + c["n_test"] for c in inputs["clients"]] == [120, 60, 150]
    assert [c["n_test"] for c in inputs["clients"]] == [24, 12, 30]
    assert inputs["num_classes"] == 2 and inputs["class_names"] == ["0", "1"] and len(inputs["feature_names"]) == 30
    assert len(inputs["scaling"]["mean"]) == 30 and results["num_draws"] == 60
    assert "posterior_mean_error" not in results and (out / "posterior.nc").is_file()
    assert (out / "summary.json").is_file()  # the outputs and predictions: tests/app/test_tutorial.py


def test_built_from_text_in_the_configs_folder(tmp_path, frame):
    path = write(tmp_path, frame, data='file = "all.csv"\npartition = { kind = "dirichlet", num_clients = 4, '
                                       'alpha = 0.5 }', parts={"all.csv": frame})
    cfg, built = config.from_text(path.read_text(), tmp_path)
    assert built.data.num_clients == 4 and built.exact is None and len(built.tests) == 4
    assert built.model.dim == 31 and built.step == {"value": 1e-3, "rule": "given"}
    assert sum(c["n_train"] for c in built.inputs.clients) == built.data.total
    again = config.model_from_config(cfg, built.inputs)
    theta = jnp.linspace(-1, 1, 31)
    datum = (built.data.x[0][0], built.data.x[1][0])
    assert float(again.log_likelihood(theta, datum)) == float(built.model.log_likelihood(theta, datum))


USER_MODEL = '''
import fedmcmc
from fedmcmc.models import logistic_regression


def build(num_features, prior_scale=1.0):
    base = logistic_regression(num_features, prior_scale)
    return fedmcmc.Model(base.log_likelihood, base.log_prior, base.dim, "no-intercept", base.predict)


def wrong(num_features):
    return "a model"
'''


def test_a_users_model_function_next_to_the_config(tmp_path, frame):
    (tmp_path / "hospital_model_ok.py").write_text(USER_MODEL)
    path = write(tmp_path, frame, model='name = "hospital_model_ok:build"\nprior_scale = 2.0\ntemperature = 0.5')
    _, built = config.from_text(path.read_text(), tmp_path)
    assert built.model.dim == 30 and built.model.name == "no-intercept-T0.5"
    reference = logistic_regression(30, 2.0)
    theta, datum = jnp.full(30, 0.1), (built.data.x[0][0], built.data.x[1][0])
    np.testing.assert_allclose(built.model.log_likelihood(theta, datum),
                               2 * reference.log_likelihood(theta, datum), rtol=1e-6)


def run_fails(capsys, path, *fragments):
    """The CLI refuses the run: exit code 2, one line with the fragments, nothing in the output folder."""
    out = path.parent / "out"
    assert main(["run", str(path), "--out", str(out), "--no-progress", "--workers", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedmcmc: error:"), lines
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not out.exists()


def test_bad_data_one_line_exit_2_nothing_written(tmp_path, frame, capsys):
    good = {"site_a.csv": frame.iloc[:50], "site_b.csv": frame.iloc[50:90]}

    def case(name, part, *fragments, data='files = ["site_a.csv", "site_b.csv"]', module=None, **kw):
        folder = tmp_path / name
        folder.mkdir()
        if module:
            (folder / f"model_{name}.py").write_text(module)
        run_fails(capsys, write(folder, frame, data=data, parts={**good, "site_b.csv": part}, **kw), *fragments)

    text = frame.iloc[50:90].astype(object)
    text.iloc[6, 3] = "twelve"
    case("text", text, "site_b.csv row 7 (line 8), column 'mean area': 'twelve' is not a number")
    nan = frame.iloc[50:90].astype(object)
    nan.iloc[2, 0] = float("nan")
    case("nan", nan, "site_b.csv row 3 (line 4), column 'mean radius': is empty")
    inf = frame.iloc[50:90].astype(object)
    inf.iloc[4, 1] = float("inf")
    case("inf", inf, "site_b.csv row 5 (line 6), column 'mean texture': 'inf' is not a finite number")
    label = frame.iloc[50:90].copy()
    label.iloc[9, -1] = 2
    case("label", label, "site_b.csv row 10 (line 11), column 'label': label '2' is not among classes = [0, 1]")
    case("target", frame.iloc[50:90].rename(columns={"label": "y"}), "site_b.csv: no target column 'label'")
    case("features", frame.iloc[50:90].drop(columns=["worst area"]), "site_b.csv has inputs of shape [29]",
         "site_a.csv has [30]")
    case("empty", frame.iloc[:0], "site_b.csv holds no data rows")
    case("split", frame.iloc[50:52], "site_b.csv: 2 row(s) leave an empty test part with test_fraction = 0.2")
    case("module", frame.iloc[50:90], "cannot import 'no_such_module'", "next to the config file",
         model='name = "no_such_module:build"')
    case("return", frame.iloc[50:90], "returned str, not a fedmcmc.Model", model='name = "model_return:wrong"',
         module=USER_MODEL)
    case("key", frame.iloc[50:90], "unknown key(s) ['hidden'] in [model] for 'logistic'; allowed:",
         model='name = "logistic"\nhidden = [3]')
    case("needs", frame.iloc[50:90], "'model_needs:needs' needs ['depth']; set them in [model]",
         model='name = "model_needs:needs"', module=USER_MODEL + "\n\ndef needs(num_features, depth):\n    pass\n")
    (tmp_path / "devices").mkdir()
    path = write(tmp_path / "devices", frame, data='files = ["site_a.csv", "site_b.csv"]', parts=good)
    path.write_text(path.read_text() + "devices = 2\n")  # [run] is the last section
    run_fails(capsys, path, "devices=2 on CPU", "use workers=2")


NOISE_MODEL = '''
import jax.numpy as jnp
import fedmcmc


def build(num_features, prior_scale=100.0):
    """Linear regression with unknown noise: theta = [intercept, slopes, log sigma]."""

    def log_likelihood(theta, datum):
        x, y = datum
        return -0.5 * ((y - theta[0] - jnp.dot(x, theta[1:-1])) / jnp.exp(theta[-1])) ** 2 - theta[-1]

    return fedmcmc.Model(log_likelihood, lambda theta: -0.5 * jnp.sum(theta**2) / prior_scale**2,
                         num_features + 2, "noise-regression", lambda theta, x: theta[0] + x @ theta[1:-1])
'''

CG_DSGLD = """
[data]
files = ["site_0.csv", "site_1.csv", "site_2.csv", "site_3.csv"]
target = "y"
task = "regression"

[model]
name = "noise_model:build"

[sampler]
name = "cg-dsgld"
step_size = 1e-6
local_steps = 10
surrogate = "laplace"

[run]
seed = 0
num_chains = 2
num_iterations = 40
"""


@pytest.mark.slow
def test_cg_dsgld_with_laplace_surrogates_on_a_regression_with_unknown_noise(tmp_path, capsys, monkeypatch):
    """Sites split by the response (about 150, noise 20): each site's Laplace surrogate is found
    from theta = 0, where the local log-density is not concave, and the run finishes; a surrogate
    that is not finite is named as such, not blamed on the step size."""
    import pandas as pd

    from fedmcmc.estimators import surrogates

    rng = np.random.default_rng(0)
    x = rng.normal([50.0, 2.0, 120.0], [10.0, 1.0, 15.0], size=(240, 3))
    y = 150.0 + (x - [50.0, 2.0, 120.0]) @ np.array([1.5, -8.0, 0.6]) + rng.normal(0.0, 20.0, 240)
    for i, rows in enumerate(np.array_split(np.argsort(y), 4)):
        pd.DataFrame({"a": x[rows, 0], "b": x[rows, 1], "c": x[rows, 2], "y": y[rows]}).to_csv(
            tmp_path / f"site_{i}.csv", index=False)
    (tmp_path / "noise_model.py").write_text(NOISE_MODEL)
    path = tmp_path / "run.toml"
    path.write_text(CG_DSGLD)
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--workers", "1"]) == 0
    capsys.readouterr()

    def failing(s, covariance):
        def fit(key, model, client_data, theta0, share):
            q = surrogates.laplace(covariance)(key, model, client_data, theta0, share)
            return q._replace(shift=jnp.where(client_data.index == 2, jnp.nan, q.shift))

        return fit

    monkeypatch.setitem(config._SURROGATES, "laplace", failing)
    assert main(["run", str(path), "--out", str(tmp_path / "bad"), "--no-progress", "--workers", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "shard 2's Gaussian surrogate is not finite" in lines[0], lines
    assert "step size" not in lines[0]
