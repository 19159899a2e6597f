"""The QLSD BNN study on heterogeneous clients (QLSD Table S2 analogue), run in-process with tiny settings."""

import math

import numpy as np
import pytest

from fedmcmc.app.studies import get, qlsd_bnn_heterogeneous as study
from fedmcmc.app.studies.runner import run_study

# 7x7 images, an MLP 49-8-10, 256 iterations, four methods (a pooled baseline, QLSD with partial
# participation, QLSD++, FSGLD from the warm start): the study in seconds, compilation being most of it.
METHODS = ["SGLD", "QLSD (PP)", "QLSD++", "FSGLD (warm)"]
TINY = dict(model="mlp", image_size=7, hidden=[8], iterations=256, burn_in=128, thinning=32, num_test=300,
            num_ood=300, surrogate_steps=20, surrogate_burn_in=20, warm_start_rounds=16, methods=METHODS)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("qlsd-bnn")
    return out, run_study(study, out, quick=True, progress=False, settings=TINY)


@pytest.mark.slow
def test_every_method_reports_finite_calibration_metrics(tiny):
    out, r = tiny
    assert get("qlsd-bnn-heterogeneous") is study
    assert list(r["methods"]) == METHODS
    for label, m in r["methods"].items():
        assert not m.get("diverged"), (label, m)
        for key in ("accuracy", "ece", "brier", "nll", "ood_auroc"):
            assert math.isfinite(m[key]), (label, key, m[key])
        assert 0 <= m["ece"] <= 1 and 0 <= m["brier"] <= 2 and 0 <= m["ood_auroc"] <= 1
        assert m["num_draws"] == 4 and m["num_points"] == 300
        assert sum(m["reliability"]["counts"]) == 300
    for name in ("results.json", "reliability.png", "partition.png", "posterior.nc"):
        assert (out / name).stat().st_size > 0


@pytest.mark.slow
def test_bma_learns_far_above_chance_and_bits_follow_participation(tiny):
    _, r = tiny
    m = r["methods"]
    # 10 balanced classes: chance is 0.1 (s.e. 0.017 on 300 points); 256 iterations of a 49-8-10 MLP
    # do much better, even through s = 2 quantisation with a quarter of the clients
    for label in ("SGLD", "QLSD (PP)", "QLSD++"):
        assert m[label]["accuracy"] > 0.25, (label, m[label]["accuracy"])
    assert m["SGLD"]["upload_bits_per_chain"] == 0
    # Bernoulli(1/4) participation: about 5 of 20 clients a round; s = 2 quantised uploads
    # cost at most 1 + 2 bits a coordinate (plus a header), far below 32-bit floats
    d = r["settings"]["dim"]
    assert m["QLSD++"]["mean_active_clients_per_round"] == 20
    assert 3.5 < m["QLSD (PP)"]["mean_active_clients_per_round"] < 6.5
    assert m["QLSD++"]["upload_bits_per_chain"] <= 256 * 20 * (3 * d + 34)
    assert m["FSGLD (warm)"]["setup_bits_per_chain"] == 20 * 32 * 2 * d  # a diagonal surrogate per shard
    # the warm start's federated SGLD gradients (16 rounds x 20 clients x 10 points) are counted
    assert r["warm_start"]["point_gradients"] == m["FSGLD (warm)"]["warm_start_point_gradients"] == 16 * 20 * 10
    assert m["FSGLD (warm)"]["point_gradients_total"] == 3_200 + 256 * 10
    c = r["criterion_qlsd_pp_within_2_points_of_sgld"]
    assert c["within_2_points"] == (c["gap_points"] <= 2)


@pytest.mark.slow
def test_partition_is_the_dominant_label_split(tiny):
    _, r = tiny
    p = r["data"]["partition"]
    counts = np.array(p["counts"])  # 400 training digits per class: 160 to its 2 owners, 4 to each other client
    assert counts.shape == (20, 10) and p["disjoint"]
    for c in range(20):
        assert counts[c, c % 10] == 160 and np.all(np.delete(counts[c], c % 10) == 4)


def test_downsample_averages_blocks():
    x = np.arange(2 * 28 * 28, dtype=np.float32).reshape(2, 28, 28)
    y = study.downsample(x, 14)
    assert y.shape == (2, 14, 14) and y[1, 3, 5] == x[1, 6:8, 10:12].mean()
    with pytest.raises(ValueError, match="image_size must divide 28"):
        study.downsample(x, 5)


@pytest.mark.parametrize("settings, fragment", [
    (dict(local_steps=7), "local_steps (7) must divide"),
    (dict(warm_start_rounds=0), "warm_start_rounds >= 1"),
    (dict(methods=["SGLD", "HMC"]), "unknown methods ['HMC']"),
    (dict(model="resnet"), "model must be 'mlp' or 'lenet5'"),
])
def test_bad_settings_are_named(tmp_path, settings, fragment):
    with pytest.raises(ValueError) as err:
        run_study(study, tmp_path, quick=True, progress=False, settings={**TINY, **settings})
    assert fragment in str(err.value) and "\n" not in str(err.value)
