"""The QLSD studies with tiny settings: memory (Fig. S3), logistic regression (Table 3), omega
(Fig. S2) and the big-data regime (Table 2): what they write, and checks that can fail."""

import math

import numpy as np
import pytest
from scipy import special

import harness as h
from fedmcmc.compression import quantization
from fedmcmc.app.studies import get, qlsd_big_data, qlsd_logistic, qlsd_memory, qlsd_omega, qlsd_toy_gaussian
from fedmcmc.app.studies.runner import run_study
from fedmcmc.models.gaussian import GaussianPosterior
from fedmcmc.samplers import qlsd_pp


@pytest.mark.slow
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
    # the paper's metric, ||v - v_ref||_2, and the relative one, mean over coordinates of |v - v_ref| / v_ref
    assert qlsd_memory.variance_error([4.0, 1.0], [1.0, 5.0]) == pytest.approx(5.0)
    assert qlsd_memory.relative_variance_error([2.0, 0.5], [1.0, 1.0]) == pytest.approx(0.75)
    assert qlsd_memory.relative_variance_error([[3.0, 4.0]], [3.0, 2.0]) == pytest.approx([0.5])
    x = np.random.default_rng(0).standard_normal((3, 50, 2))
    ends, var = qlsd_memory.running_variance(x, 6)
    assert ends[0] == 2 and ends[-1] == 50
    for j, n in enumerate(ends):
        np.testing.assert_allclose(var[:, j], x[:, :n].var(axis=1), rtol=1e-10, atol=1e-12)
    with pytest.raises(ValueError, match="reference variance"):
        qlsd_memory.variance_error([1.0, 1.0], [1.0])


@pytest.mark.slow
def test_qlsd_memory_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path / "cache"))
    r = run_study(qlsd_memory, tmp_path / "out", quick=True, progress=False, settings=dict(
        levels=[2], num_iterations=2000, burn_in=500, num_chains=4, reference_samples=500, reference_warmup=200,
        reference_chains=2, curve_points=5))
    assert get("qlsd-memory") is qlsd_memory
    m, s = r["methods"], r["settings"]
    assert set(m) == {"QLSD++ s=2, memory", "QLSD++ s=2, no memory", "LSD++"}
    assert s["num_clients"] == 50 and s["dim"] == 2 and s["prior_variance"] == pytest.approx(2e-2)
    assert qlsd_memory.FULL["burn_in"] == 0 and qlsd_memory.FULL["num_iterations"] == 100_000
    # omega = min(d / s^2, sqrt(d) / s) = 0.5 for d = 2, s = 2: alpha = 2/3 with memory, 0 without
    assert m["QLSD++ s=2, memory"]["memory_rate"] == pytest.approx(2 / 3)
    assert m["QLSD++ s=2, no memory"]["memory_rate"] == 0.0
    assert m["LSD++"]["bits_per_iteration"] == 50 * 2 * 32
    for v in m.values():
        assert len(v["curve"]["mean"]) == len(v["curve"]["iterations"]) <= 5
        assert v["curve"]["iterations"][-1] == 2000
    # the effect the figure shows: without memory the compression noise (omega ||grad U_i||^2,
    # large on heterogeneous clients) inflates the variance; with memory it stays near LSD++
    no, yes = m["QLSD++ s=2, no memory"], m["QLSD++ s=2, memory"]
    assert min(no["variance_ratio_to_reference"]) > 1.3 > max(yes["variance_ratio_to_reference"])
    assert no["variance_error"] > 3 * yes["variance_error"]
    assert 0.3 < r["reference"]["acceptance"] < 1
    for name in ("results.json", "variance_error.png", "posterior.nc"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_paper_efficiency_is_table_3():
    """32 d / QSGD bound (natural log) at d = 784 gives Table 3's 7.6 / 6.7 / 3.1 for 4 / 8 / 16 bits."""
    for p, paper in ((4, 7.6), (8, 6.7), (16, 3.1)):
        assert round(qlsd_logistic.paper_efficiency(2**p, 784), 1) == paper


@pytest.mark.slow
def test_qlsd_logistic_tiny(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path / "cache"))
    r = run_study(qlsd_logistic, tmp_path / "out", quick=True, progress=False, settings=dict(
        bits=[4], baselines=[], num_train=600, num_clients=10, num_iterations=200, burn_in=100, thinning=10,
        reference_samples=20, reference_warmup=20, reference_chains=1, test_size=200))
    assert get("qlsd-logistic") is qlsd_logistic
    m, s = r["methods"], r["settings"]
    assert set(m) == {"LSD++", "QLSD++ 4 bits"}
    assert s["dim"] == 784 and s["num_train"] == sum(s["client_sizes"]) == 600 and s["num_test"] == 200
    assert s["prior_variance"] == 2e-2 and s["step_size"] == 1e-5
    lsd, q = m["LSD++"], m["QLSD++ 4 bits"]
    assert lsd["bits_per_iteration"] == 10 * 784 * 32
    assert q["relative_efficiency_encoded"] == pytest.approx(lsd["bits_per_iteration"] / q["bits_per_iteration"])
    assert q["relative_efficiency_encoded"] > 2
    assert q["relative_efficiency_paper_formula"] == qlsd_logistic.paper_efficiency(16, 784)
    assert q["paper_hpd_error_vs_lsd"] == 6.1e-3 and r["paper"]["QLSD++ 16 bits"]["relative_efficiency"] == 3.1
    assert q["hpd_error_vs_lsd"] == pytest.approx(abs(q["hpd_threshold"] - lsd["hpd_threshold"]) / lsd["hpd_threshold"])
    eta_ref = r["reference"]["hpd_threshold"]
    assert q["hpd_error_vs_nuts"] == pytest.approx(abs(q["hpd_threshold"] - eta_ref) / eta_ref)
    # shared Langevin noise: the compression error is far below the error between independent chains
    assert q["hpd_error_vs_lsd"] < q["hpd_error_vs_lsd_unpaired"] / 10
    for name in ("results.json", "hpd_error_vs_efficiency.png", "posterior.nc"):
        assert (tmp_path / "out" / name).stat().st_size > 0


def test_kappa_bar_and_stationary_moment_closed_forms():
    d = 50
    # s = 1: f_j = |u_j|, so kappa = sum_j |u_j| - 1, and E|u_j| = Gamma(d/2) / (sqrt(pi) Gamma((d+1)/2))
    exact = d * math.exp(special.gammaln(d / 2) - special.gammaln((d + 1) / 2)) / math.sqrt(math.pi) - 1
    k, se = qlsd_omega.kappa_bar(1, d, 20_000)
    assert abs(k - exact) < h.Z * se
    # kappa = 0 is full-gradient ULA: d times its stationary variance
    post = GaussianPosterior(np.zeros(d), 1 / 2042)
    ula = qlsd_toy_gaussian.stationary_ula_posterior(post, 4.9e-4)
    assert qlsd_omega.stationary_second_moment(4.9e-4, [1000, 1042], 0.0, d) == pytest.approx(d * ula.var)
    assert qlsd_omega.loglog_slope([1, 2, 4], [3, 12, 48])[0] == pytest.approx(2.0)


@pytest.mark.slow
def test_qlsd_omega_tiny(tmp_path):
    r = run_study(qlsd_omega, tmp_path, quick=True, progress=False, settings=dict(
        levels=[1, 4, 16], step_sizes=[4.9e-4, 4.9e-5], sphere_draws=5000, mc_step_sizes=[4.9e-4], mc_levels=[1],
        num_iterations=1500, burn_in=100, num_chains=4))
    assert get("qlsd-omega") is qlsd_omega
    rows = r["closed_form"]["0.00049"]["rows"]
    assert [x["levels"] for x in rows] == [1, 4, 16]
    assert all(a["delta"] > b["delta"] > 0 for a, b in zip(rows, rows[1:]))  # more compression, more bias
    # the chains agree with the second-moment recursion (closed with isotropy: allow 10% besides 5 s.e.)
    c = r["chains"]["0.00049"]
    assert abs(c["lsd_second_moment"] - c["lsd_second_moment_exact"]) < h.Z * c["lsd_second_moment_se"]
    (row,) = c["rows"]
    assert abs(row["delta"] - row["closed_form_delta"]) < h.Z * row["delta_se"] + 0.1 * row["closed_form_delta"]
    assert (tmp_path / "bias_vs_omega.png").stat().st_size > 0


@pytest.mark.slow
def test_qlsd_big_data_tiny(tmp_path):
    r = run_study(qlsd_big_data, tmp_path, quick=True, progress=False, settings=dict(
        totals=[300, 3000], num_iterations=400, burn_in=100, num_chains=4, methods=["QLSD#", "QLSD*"]))
    assert get("qlsd-big-data") is qlsd_big_data
    m = r["methods"]
    assert set(m) == {"QLSD#", "QLSD*"}
    for rows in m.values():
        assert [x["step_size"] * x["N"] for x in rows] == pytest.approx([0.2, 0.2])
    # the claim: with gamma = eta / N, QLSD#'s bias stays, so relative to the posterior's spread d / N it
    # grows like N (10 times here); QLSD*'s shrinks like 1 / N: its relative bias stays put, and small
    sharp, star = m["QLSD#"], m["QLSD*"]
    assert sharp[1]["bias"] > sharp[0]["bias"] / 2 > h.Z * sharp[0]["bias_se"]
    assert sharp[1]["relative_bias"] > 5 * sharp[0]["relative_bias"]
    assert abs(star[1]["relative_bias"] - star[0]["relative_bias"]) < h.Z * np.hypot(star[1]["relative_bias_se"],
                                                                                   star[0]["relative_bias_se"])
    assert star[1]["relative_bias"] < sharp[1]["relative_bias"] / 10
    assert (tmp_path / "bias_vs_N.png").stat().st_size > 0
