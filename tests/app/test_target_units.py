"""A regression in the user's units: the target standardised from the clients' pooled moments (in
the simulator and in the Flower nodes' summaries), and a `fedmcmc run` whose table, coefficients
and predictions are in the data's own units."""

import json
import tomllib

import numpy as np
import pandas as pd
import pytest

from fedmcmc.app import cli, config, inputs
from fedmcmc.app.flower import nodes
from fedmcmc.data import local
from fedmcmc.data.federated import from_clients
from fedmcmc.models import linear_regression_posterior

CONFIG = """
[data]
files = ["site_0.csv", "site_1.csv", "site_2.csv"]
target = "score"
task = "regression"
test_fraction = 0.2

[model]
name = "linear"
{model}

[sampler]
name = "lsd*"
step_size = "auto"

[run]
seed = 0
num_chains = 4
num_iterations = 1000
"""
MEAN, SCALE, SLOPES, NOISE = np.array([100.0, 50.0]), np.array([15.0, 5.0]), np.array([0.8, -2.0]), 6.0


def rows(rng, n):
    """Features about 100 and 50, a score about 100 (sd about 17), noise 6."""
    x = rng.normal(MEAN, SCALE, size=(n, 2))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "score": 100.0 + (x - MEAN) @ SLOPES + rng.normal(0, NOISE, n)})


def write(folder, model=""):
    frame = rows(np.random.default_rng(0), 300)
    for i, part in enumerate(np.array_split(np.arange(300), 3)):
        frame.iloc[part].to_csv(folder / f"site_{i}.csv", index=False)
    path = folder / "run.toml"
    path.write_text(CONFIG.format(model=model))
    return path


def training_rows(section, folder):
    """Each client's training part, as its node holds it."""
    return [inputs.split_local(section, i, c)[0] for i, c in enumerate(local.read_clients(section, folder))]


def test_the_target_is_standardised_from_the_clients_moments(tmp_path):
    section = tomllib.loads(write(tmp_path).read_text())["data"]
    train, tests, info = inputs.load_data(section, tmp_path)
    pooled = np.concatenate([t.y for t in training_rows(section, tmp_path)])
    assert info.target_scaling["mean"] == pytest.approx(pooled.mean(), rel=1e-12)
    assert info.target_scaling["scale"] == pytest.approx(pooled.std(), rel=1e-9)
    y = np.concatenate([train.unpadded(i)[1] for i in range(train.num_clients)])
    assert abs(y.mean()) < 1e-5 and y.std() == pytest.approx(1.0, rel=1e-5)  # what the model sees
    held = [split[1].y for split in (inputs.split_local(section, i, c)
                                      for i, c in enumerate(local.read_clients(section, tmp_path)))]
    for (_, got), want in zip(tests, held):  # the held-out targets in their own units
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert config.model_from_config({"model": {"name": "linear", "noise_scale": 6.0}}, info).dim == 3
    unscaled = inputs.load_data({**section, "standardise": False}, tmp_path)[2]
    assert unscaled.target_scaling is None and unscaled.scaling is None


def test_flower_summaries_carry_the_target_moments_exactly(tmp_path):
    section = tomllib.loads(write(tmp_path).read_text())["data"]
    summaries = [inputs.split_local(section, i, c)[2] for i, c in enumerate(local.read_clients(section, tmp_path))]
    back = [nodes.summary_from_json(nodes.summary_to_json(s)) for s in summaries]
    for s, b in zip(summaries, back):
        assert b.target_moments.count == s.target_moments.count
        assert float(b.target_moments.total) == float(s.target_moments.total)  # float64, bit for bit
        assert float(b.target_moments.total_sq) == float(s.target_moments.total_sq)
    info = inputs.combine(section, back)[0]
    assert info == inputs.combine(section, summaries)[0] == inputs.load_data(section, tmp_path)[2]
    assert nodes.inputs_from_json(json.dumps(info._asdict())) == info  # the server's `nodes` message


@pytest.mark.slow
def test_a_run_reads_in_the_data_units(tmp_path, capsys):
    """Unknown noise: the table of coef and sigma (printed, summary.csv) and `fedmcmc predict` in
    the score's units. Known noise 6: the posterior of coef is the exact Gaussian, mapped from the
    standardised model's, within five Monte-Carlo standard errors."""
    path = write(tmp_path)
    assert cli.main(["run", str(path), "--out", str(tmp_path / "out"), "--no-progress", "--workers", "1"]) in (0, 1)
    printed = capsys.readouterr().out
    table = pd.read_csv(tmp_path / "out" / "summary.csv", index_col="parameter")
    assert list(table.index) == ["coef[intercept]", "coef[a]", "coef[b]", "sigma"]
    assert all(label in printed for label in table.index)
    assert table.loc["sigma", "hdi_3%"] < NOISE < table.loc["sigma", "hdi_97%"] + 1.0  # 6 in the score's units
    new = rows(np.random.default_rng(1), 40)
    new.to_csv(tmp_path / "new.csv", index=False)
    assert cli.main(["predict", str(tmp_path / "out"), str(tmp_path / "new.csv")]) == 0
    pred = pd.read_csv(tmp_path / "out" / "predictions-new.csv")
    assert np.sqrt(np.mean(pred["residual"] ** 2)) < 1.5 * NOISE  # the score's sd is about 17
    assert abs(pred["mean"].mean() - new["score"].mean()) < NOISE  # about 100, not standardised
    assert np.mean((pred["lower"] <= new["score"]) & (new["score"] <= pred["upper"])) > 0.8

    known = tmp_path / "known"
    known.mkdir()
    path = write(known, "noise_scale = 6.0")
    assert cli.main(["run", str(path), "--out", str(known / "out"), "--no-progress", "--workers", "1"]) in (0, 1)
    capsys.readouterr()
    section = tomllib.loads(path.read_text())["data"]
    train = training_rows(section, path.parent)
    x, y = np.concatenate([t.x for t in train]), np.concatenate([t.y for t in train])
    m, s, m_y, s_y = x.mean(axis=0), x.std(axis=0), y.mean(), y.std()
    design = np.column_stack([np.ones(len(y)), (x - m) / s])
    exact = linear_regression_posterior(from_clients([(design, (y - m_y) / s_y)], dtype=np.float64), NOISE / s_y)
    a = s_y * np.vstack([np.concatenate([[1.0], -m / s]), np.column_stack([np.zeros(2), np.diag(1 / s)])])
    mean, sd = m_y * np.eye(3)[0] + a @ exact.mean, np.sqrt(np.diag(a @ exact.cov @ a.T))
    got = pd.read_csv(known / "out" / "summary.csv", index_col="parameter")
    assert list(got.index) == ["coef[intercept]", "coef[a]", "coef[b]"]
    mcse = sd / np.sqrt(got["ess_bulk"].to_numpy())
    np.testing.assert_array_less(np.abs(got["mean"].to_numpy() - mean), 5 * mcse)
    np.testing.assert_allclose(got["sd"].to_numpy(), sd, rtol=0.05 + 5 / np.sqrt(2 * got["ess_bulk"].min()))
