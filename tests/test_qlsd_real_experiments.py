"""The QLSD++ memory (Fig. S3) and logistic regression (Table 3 analogue) reproductions with tiny
settings: what they write, and checks that can fail."""

import numpy as np
import pytest

import harness as h
from fedmcmc import surrogates
from fedmcmc.compression import quantization
from fedmcmc.experiments import get, qlsd_logistic, qlsd_memory
from fedmcmc.samplers import qlsd_pp


def test_memory_rate_zero_is_no_memory():
    """alpha = 0 is QLSD++ without memory: the same chain as memory=False, bit for bit (were the rate
    ignored, the default 1 / (omega + 1) would run and the chains would differ)."""
    data = h.problem()
    model = h.model_for(data)
    q = quantization(2)
    a = h.run(qlsd_pp(model, 1e-3, 5, q, refresh_every=7, memory_rate=0.0), data, chains=3, iterations=60, burn_in=0)
    b = h.run(qlsd_pp(model, 1e-3, 5, q, refresh_every=7, memory=False), data, chains=3, iterations=60, burn_in=0)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        qlsd_pp(model, 1e-3, 5, q, memory_rate=-0.1)


def test_variance_error_helpers_against_closed_forms():
    # relative error, mean over coordinates: (|2 - 1| / 1 + |0.5 - 1| / 1) / 2
    assert qlsd_memory.relative_variance_error([2.0, 0.5], [1.0, 1.0]) == pytest.approx(0.75)
    assert qlsd_memory.relative_variance_error([[3.0, 4.0]], [3.0, 2.0]) == pytest.approx([0.5])
    x = np.random.default_rng(0).standard_normal((3, 50, 2))
    ends, var = qlsd_memory.running_variance(x, 6)
    assert ends[0] == 2 and ends[-1] == 50
    for j, n in enumerate(ends):
        np.testing.assert_allclose(var[:, j], x[:, :n].var(axis=1), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="reference variance"):
        qlsd_memory.relative_variance_error([1.0, 1.0], [1.0])


def test_qlsd_memory_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path / "cache"))
    r = qlsd_memory.run(tmp_path / "out", quick=True, progress=False, settings=dict(
        levels=[2], num_iterations=3000, burn_in=1000, num_chains=4, reference_samples=1000, reference_warmup=300,
        reference_thinning=2, reference_chains=2, curve_points=5))
    assert get("qlsd-memory") is qlsd_memory
    m = r["methods"]
    assert set(m) == {"QLSD++ s=2, memory", "QLSD++ s=2, no memory", "LSD++"}
    assert r["settings"]["num_clients"] == 50 and r["settings"]["dim"] == 2
    # omega = min(d / s^2, sqrt(d) / s) = 0.5 for d = 2, s = 2: alpha = 2/3 with memory, 0 without
    assert m["QLSD++ s=2, memory"]["memory_rate"] == pytest.approx(2 / 3)
    assert m["QLSD++ s=2, no memory"]["memory_rate"] == 0.0
    assert m["LSD++"]["bits_per_iteration"] == 50 * 2 * 32
    for v in m.values():
        assert len(v["curve"]["mean"]) == len(v["curve"]["iterations"]) <= 5
        assert v["curve"]["iterations"][-1] == 3000
    # the effect the figure shows: without memory the compression noise (omega ||grad U_i||^2,
    # large on heterogeneous clients) inflates the variance; with memory it is near LSD++
    assert min(m["QLSD++ s=2, no memory"]["variance_ratio_to_reference"]) > 1.5
    assert m["QLSD++ s=2, no memory"]["variance_error"] > 3 * m["QLSD++ s=2, memory"]["variance_error"]
    assert m["QLSD++ s=2, memory"]["variance_error"] < 0.3
    assert 0.3 < r["reference"]["acceptance"] < 1
    for name in ("results.json", "variance_error.png", "posterior.nc"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_qlsd_logistic_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path / "cache"))
    r = qlsd_logistic.run(tmp_path / "out", quick=True, progress=False, settings=dict(
        bits=[4], num_iterations=600, burn_in=200, num_chains=2, reference_samples=200, reference_warmup=100,
        reference_chains=1))
    assert get("qlsd-logistic") is qlsd_logistic
    m, s = r["methods"], r["settings"]
    assert set(m) == {"LSD++", "QLSD++ 4 bits", "DG-SGLD", "FSGLD"}
    assert s["num_clients"] == 50 and s["dim"] == 11 and sum(s["client_sizes"]) == s["num_train"] == 15216
    # bits per chain iteration: 50 clients x 11 floats for LSD++ and DG-SGLD; FSGLD sends one draw
    # per visit of 10 iterations, plus its diagonal surrogates once (precision and shift, 22 floats each)
    assert m["LSD++"]["bits_per_iteration"] == m["DG-SGLD"]["bits_per_iteration"] == 50 * 11 * 32
    assert m["DG-SGLD"]["relative_efficiency"] == m["LSD++"]["relative_efficiency"] == 0.0
    fsgld = (60 * 11 * 32 + 50 * surrogates.surrogate_bits(11, "diag")) / 600
    assert m["FSGLD"]["bits_per_iteration"] == pytest.approx(fsgld)
    assert m["FSGLD"]["relative_efficiency"] == pytest.approx(1 - fsgld / 17600)
    assert 0.5 < m["QLSD++ 4 bits"]["relative_efficiency"] < 0.9
    eta_ref = r["reference"]["hpd_threshold"]
    for v in m.values():
        assert v["hpd_error"] == pytest.approx(abs(v["hpd_threshold"] - eta_ref) / eta_ref)
        assert v["num_draws"] == 2 * 40
    for label in ("LSD++", "QLSD++ 4 bits"):  # started at the mode, they stay in the posterior's bulk
        assert m[label]["hpd_error"] < 0.01 and m[label]["test_accuracy"] > 0.75
    for name in ("results.json", "hpd_error_vs_efficiency.png", "posterior.nc"):
        assert (tmp_path / "out" / name).stat().st_size > 0
