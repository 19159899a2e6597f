"""Predictive and calibration metrics against independent computations: scikit-learn and scipy,
hand-computed small cases, and synthetic predictors whose calibration error is known."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from fedmcmc import evaluation as ev
from fedmcmc.models import logistic_regression


def _logistic_with_predict(dim):
    def predict(theta, x):
        p1 = jax.nn.sigmoid(x @ theta)
        return jnp.stack([1.0 - p1, p1], axis=-1)

    return logistic_regression(dim)._replace(predict=predict)


# ----------------------------------------------------------------------------- predictions


def test_predict_draws_matches_a_direct_loop_over_draws():
    rng = np.random.default_rng(0)
    d, n = 3, 11
    model = _logistic_with_predict(d)
    samples = rng.standard_normal((3, 7, d)).astype(np.float32)  # 21 draws: batches 4,4,4,4,4,1 (padded)
    x = rng.standard_normal((n, d)).astype(np.float32)
    out = ev.predict_draws(model, samples, x, batch_size=4)
    flat = samples.reshape(-1, d)
    expected = np.stack([np.asarray(model.predict(jnp.asarray(t), x)) for t in flat])
    assert out.shape == (21, n, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    # chain-major flattening: draw (c, k) is row c * 7 + k
    np.testing.assert_allclose(out[1 * 7 + 2], expected[9], rtol=1e-6)
    # the streamed model average equals the average of the stored draws
    np.testing.assert_allclose(ev.predict_bma(model, samples, x, batch_size=5), ev.bayes_average(out),
                               rtol=1e-6)
    # one draw [d] and a batch larger than the number of draws
    np.testing.assert_allclose(ev.predict_draws(model, flat[0], x, batch_size=64)[0], expected[0], rtol=1e-6)


def test_bayes_average_of_identical_draws_is_the_single_predictive():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.ones(4), size=9)
    np.testing.assert_allclose(ev.bayes_average(np.broadcast_to(p, (5, 9, 4))), p, rtol=1e-15)
    # and it is the plain mean over draws
    q = rng.dirichlet(np.ones(4), size=(3, 9))
    np.testing.assert_allclose(ev.bayes_average(q), (q[0] + q[1] + q[2]) / 3, rtol=1e-14)


def test_predict_draws_needs_a_predict_function():
    with pytest.raises(ValueError, match="no predict"):
        ev.predict_draws(logistic_regression(2)._replace(predict=None), np.zeros((2, 2)), np.zeros((3, 2)))


def test_neg_log_posterior_matches_a_direct_sum():
    rng = np.random.default_rng(2)
    d, n = 3, 13
    model = logistic_regression(d, prior_scale=2.0)
    x = rng.standard_normal((n, d))
    y = (rng.random(n) < 0.5).astype(np.float64)
    samples = rng.standard_normal((2, 5, d))
    u = ev.neg_log_posterior(model, samples, (x, y), batch_size=3)
    expected = []
    for t in samples.reshape(-1, d):
        z = x @ t
        loglik = np.sum(y * z - np.logaddexp(0.0, z))
        expected.append(-(loglik - 0.5 * np.sum(t**2) / 4.0))
    np.testing.assert_allclose(u, expected, rtol=1e-5)


# ----------------------------------------------------------------------------- point metrics


def test_binary_metrics_match_sklearn():
    rng = np.random.default_rng(3)
    n = 500
    p1 = rng.random(n)
    y = (rng.random(n) < p1).astype(int)
    probs = np.stack([1 - p1, p1], axis=1)
    assert ev.nll(probs, y) == pytest.approx(log_loss(y, p1), rel=1e-12)
    assert ev.nll(p1, y) == pytest.approx(log_loss(y, p1), rel=1e-12)  # 1-D shorthand
    # our multi-class Brier sums over both classes: twice sklearn's positive-class score
    assert ev.brier(probs, y) == pytest.approx(2 * brier_score_loss(y, p1), rel=1e-12)
    assert ev.accuracy(probs, y) == pytest.approx(np.mean((p1 > 0.5) == y))


def test_multiclass_nll_brier_accuracy_by_hand():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    y = np.array([0, 1])
    assert ev.nll(probs, y) == pytest.approx(-(math.log(0.7) + math.log(0.1)) / 2, rel=1e-14)
    assert ev.nll(probs, y) == pytest.approx(log_loss(y, probs, labels=[0, 1, 2]), rel=1e-12)
    # (0.3^2 + 0.2^2 + 0.1^2 + 0.1^2 + 0.9^2 + 0.8^2) / 2
    assert ev.brier(probs, y) == pytest.approx(0.8, rel=1e-14)
    assert ev.accuracy(probs, y) == 0.5


def test_nll_clips_zero_probabilities():
    probs = np.array([[1.0, 0.0], [0.5, 0.5]])
    y = np.array([1, 0])
    assert ev.nll(probs, y, eps=1e-12) == pytest.approx((-math.log(1e-12) + math.log(2)) / 2, rel=1e-12)
    assert np.isfinite(ev.nll(probs, y))


def test_labels_are_checked():
    with pytest.raises(ValueError, match="labels"):
        ev.accuracy(np.full((2, 3), 1 / 3), [0, 3])
    with pytest.raises(ValueError, match="shape"):
        ev.nll(np.full((2, 3), 1 / 3), [0, 1, 2])


def test_entropy_against_scipy_and_bounds():
    rng = np.random.default_rng(4)
    p = rng.dirichlet(np.ones(5), size=20)
    np.testing.assert_allclose(ev.entropy(p), stats.entropy(p, axis=1), rtol=1e-12)
    assert ev.entropy(np.full((1, 7), 1 / 7))[0] == pytest.approx(math.log(7), rel=1e-14)
    assert ev.entropy(np.eye(3)).tolist() == [0.0, 0.0, 0.0]  # 0 log 0 = 0


# ----------------------------------------------------------------------------- calibration


def _binary_with_confidence(conf, correct):
    """Binary probabilities whose confidence is ``conf``, with labels right where ``correct``."""
    conf, correct = np.asarray(conf, float), np.asarray(correct, bool)
    probs = np.stack([1 - conf, conf], axis=1)  # predicted class 1
    return probs, np.where(correct, 1, 0)


def test_ece_and_reliability_by_hand():
    # B = 5, right-closed bins (0.4, 0.6], (0.6, 0.8], (0.8, 1]: 0.6 and 0.8 sit on edges
    probs, y = _binary_with_confidence([0.6, 0.9, 0.8, 0.55], [1, 1, 0, 0])
    rel = ev.reliability(probs, y, num_bins=5)
    assert rel.counts.tolist() == [0, 0, 2, 1, 1]
    np.testing.assert_allclose(rel.confidence[2:], [0.575, 0.8, 0.9])
    np.testing.assert_allclose(rel.accuracy[2:], [0.5, 0.0, 1.0])
    assert np.isnan(rel.confidence[:2]).all() and np.isnan(rel.accuracy[:2]).all()
    # 0.5 * 0.075 + 0.25 * 0.8 + 0.25 * 0.1
    assert ev.ece(probs, y, num_bins=5) == pytest.approx(0.2625, rel=1e-12)


def test_one_bin_ece_is_the_mean_gap_and_can_hide_miscalibration():
    # half the points: confidence 0.9, accuracy 0.7; the other half: confidence 0.6, accuracy 0.8
    n = 1000
    conf = np.r_[np.full(n, 0.9), np.full(n, 0.6)]
    correct = np.r_[np.arange(n) < 0.7 * n, np.arange(n) < 0.8 * n]
    probs, y = _binary_with_confidence(conf, correct)
    assert ev.ece(probs, y, num_bins=1) == pytest.approx(abs(correct.mean() - conf.mean()), abs=1e-12)
    assert ev.ece(probs, y, num_bins=1) == pytest.approx(0.0, abs=1e-12)
    assert ev.ece(probs, y, num_bins=15) == pytest.approx(0.5 * 0.2 + 0.5 * 0.2, rel=1e-12)


def test_ece_of_a_calibrated_predictor_vanishes_at_the_monte_carlo_rate():
    # y is drawn from the predicted probabilities, so acc(B_b) - conf(B_b) is pure noise:
    # given the confidences, E|gap_b| <= sqrt(1 / (4 n_b)), hence
    # E[ECE] <= sum_b (n_b / n) / (2 sqrt(n_b)) <= sqrt(B / (4 n)) (Cauchy-Schwarz).
    rng = np.random.default_rng(5)
    bins = 15
    values = []
    for n in (10_000, 100_000, 1_000_000):
        p = rng.dirichlet(np.ones(3), size=n)
        y = (rng.random(n)[:, None] > np.cumsum(p, axis=1)).sum(axis=1)
        e = ev.ece(p, y, bins)
        assert e < 3 * math.sqrt(bins / (4 * n)), (n, e)
        values.append(e)
    assert values[2] < values[0]
    assert values[2] < 0.006


def test_ece_of_a_miscalibrated_predictor_matches_its_closed_form():
    # confidence c ~ U(0.6, 1), correct with probability c^2: bins 9..14 of 15 are covered
    # evenly, and the population ECE is (1/6) sum_b E[c - c^2 | c in bin b], c uniform on the bin.
    rng = np.random.default_rng(6)
    n = 400_000
    c = rng.uniform(0.6, 1.0, n)
    probs, y = _binary_with_confidence(c, rng.random(n) < c**2)
    edges = np.arange(9, 16) / 15
    a, b = edges[:-1], edges[1:]
    exact = np.mean((a + b) / 2 - (a**2 + a * b + b**2) / 3)
    # every bin's gap is >= 0.03, far from 0 relative to its noise, so |.| adds no bias; the
    # estimate's standard deviation is below sqrt(0.25 / n) (labels) + 0.1 sqrt(1 / n) (counts)
    tol = 5 * (math.sqrt(0.25 / n) + 0.1 * math.sqrt(1 / n))
    assert ev.ece(probs, y, 15) == pytest.approx(exact, abs=tol)
    rel = ev.reliability(probs, y, 15)
    assert rel.counts.sum() == n and rel.counts[:9].sum() == 0


def test_accuracy_vs_threshold_by_hand():
    probs, y = _binary_with_confidence([0.6, 0.9, 0.8, 0.55], [1, 1, 0, 0])
    acc, frac = ev.accuracy_vs_threshold(probs, y, [0.0, 0.7, 0.85, 0.95])
    np.testing.assert_allclose(acc[:3], [0.5, 0.5, 1.0])
    assert np.isnan(acc[3])
    np.testing.assert_allclose(frac, [1.0, 0.5, 0.25, 0.0])


def test_plot_reliability_writes_a_png(tmp_path):
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(3), size=200)
    y = rng.integers(0, 3, 200)
    path = ev.plot_reliability(tmp_path / "rel.png",
                               {"a": (p, y), "b": ev.reliability(p**2 / (p**2).sum(1, keepdims=True), y, 10)},
                               title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- OOD and reference


def test_auroc_matches_sklearn_including_ties():
    rng = np.random.default_rng(8)
    s_in = rng.integers(0, 6, 300).astype(float)  # many ties
    s_out = rng.integers(2, 9, 200).astype(float)
    labels = np.r_[np.zeros(300), np.ones(200)]
    expected = roc_auc_score(labels, np.r_[s_in, s_out])
    assert ev.auroc(s_in, s_out) == pytest.approx(expected, rel=1e-12)
    # Mann-Whitney by brute force: P(out > in) + P(out == in) / 2
    pairs = s_out[None, :] - s_in[:, None]
    assert ev.auroc(s_in, s_out) == pytest.approx(np.mean(pairs > 0) + 0.5 * np.mean(pairs == 0), rel=1e-12)
    assert ev.auroc([0.1, 0.2], [0.3, 0.4]) == 1.0
    assert ev.auroc([0.3, 0.4], [0.1, 0.2]) == 0.0


def test_agreement_and_total_variation_by_hand():
    p = np.array([[0.6, 0.4], [0.2, 0.8], [0.5, 0.5]])
    q = np.array([[0.9, 0.1], [0.6, 0.4], [0.5, 0.5]])
    assert ev.agreement(p, q) == pytest.approx(2 / 3)
    assert ev.total_variation(p, q) == pytest.approx((0.3 + 0.4 + 0.0) / 3, rel=1e-12)
    assert ev.total_variation(p, p) == 0.0 and ev.agreement(p, p) == 1.0


# ----------------------------------------------------------------------------- QLSD Table 3


def test_hpd_interval_small_exact_case():
    lo, hi = ev.hpd_interval(np.array([3.0, 0.0, 10.0, 1.0, 2.0]), 0.8)  # 4 of 5 draws
    assert (lo, hi) == (0.0, 3.0)


def test_hpd_interval_of_a_gaussian_sample():
    # 99 % HPD of N(mu, sigma^2) is mu +- z sigma, z = Phi^{-1}(0.995) = 2.5758. Each endpoint
    # estimates a quantile at p = 0.005 with standard deviation sqrt(p (1 - p) / n) sigma / phi(z)
    # (asymptotic order-statistic variance); the width's is at most twice that.
    rng = np.random.default_rng(9)
    n, mu, sigma = 1_000_000, 1.0, 2.0
    z = stats.norm.ppf(0.995)
    assert z == pytest.approx(2.5758, abs=1e-4)
    sd_end = math.sqrt(0.005 * 0.995 / n) * sigma / stats.norm.pdf(z)
    x = mu + sigma * rng.standard_normal((n, 2))
    lo, hi = ev.hpd_interval(x, 0.99)
    np.testing.assert_allclose(hi - lo, 2 * z * sigma, atol=5 * 2 * sd_end)
    np.testing.assert_allclose((hi + lo) / 2, mu, atol=5 * sd_end)
    # pooled over a [chain, draw, d] array
    lo3, hi3 = ev.hpd_interval(x.reshape(4, n // 4, 2), 0.99)
    np.testing.assert_array_equal(lo3, lo)


def test_hpd_threshold_of_a_gaussian_posterior_is_a_chi2_quantile():
    # theta ~ N(0, s^2 I_d), U = ||theta||^2 / (2 s^2): 2U ~ chi2_d, so eta_0.99 = chi2_d.ppf(0.99) / 2.
    rng = np.random.default_rng(10)
    n, d, s = 200_000, 5, 0.7
    theta = s * rng.standard_normal((n, d))
    u = np.sum(theta**2, axis=1) / (2 * s**2)
    exact = stats.chi2.ppf(0.99, d) / 2
    density = 2 * stats.chi2.pdf(2 * exact, d)  # density of U at eta
    sd = math.sqrt(0.99 * 0.01 / n) / density
    assert ev.hpd_threshold(u, 0.99) == pytest.approx(exact, abs=5 * sd)
    # relative error: 0 against itself, exactly 10 % against a potential scaled by 1.1
    assert ev.hpd_relative_error(u, u) == 0.0
    assert ev.hpd_relative_error(1.1 * u, u) == pytest.approx(0.1, rel=1e-12)
    # two independent samples of the same posterior agree within Monte-Carlo error
    u2 = np.sum((s * rng.standard_normal((n, d))) ** 2, axis=1) / (2 * s**2)
    assert ev.hpd_relative_error(u2, u) < 5 * math.sqrt(2) * sd / exact


def test_marginal_hpd_relative_error_detects_an_inflated_spread():
    rng = np.random.default_rng(11)
    ref = rng.standard_normal((400_000, 3))
    wide = 1.2 * rng.standard_normal((400_000, 3))
    # each width is within 5 sd of its value (see the Gaussian test): |ratio - 1.2| <~ 0.01
    assert ev.marginal_hpd_relative_error(wide, ref) == pytest.approx(0.2, abs=0.02)
    assert ev.marginal_hpd_relative_error(ref, ref) == 0.0


def test_relative_efficiency():
    assert ev.relative_efficiency(8.0, 32.0) == pytest.approx(0.75)
    assert ev.relative_efficiency(np.full((2, 5), 320.0), np.full((2, 5), 3200.0)) == pytest.approx(0.9)
    assert ev.relative_efficiency(32.0, 32.0) == 0.0
    with pytest.raises(ValueError):
        ev.relative_efficiency(1.0, 0.0)


# ----------------------------------------------------------------------------- report


def test_classification_report_from_draws():
    rng = np.random.default_rng(12)
    draws = rng.dirichlet(np.ones(3), size=(4, 50))
    y = rng.integers(0, 3, 50)
    ood = rng.dirichlet(np.ones(3), size=(4, 30))
    report = ev.classification_report(draws, y, num_bins=10, ref_probs=draws, ood_probs=ood)
    bma = ev.bayes_average(draws)
    assert report["accuracy"] == ev.accuracy(bma, y)
    assert report["nll"] == ev.nll(bma, y)
    assert report["brier"] == ev.brier(bma, y)
    assert report["ece"] == ev.ece(bma, y, 10)
    assert report["mean_entropy"] == pytest.approx(ev.entropy(bma).mean())
    assert report["agreement"] == 1.0 and report["total_variation"] == 0.0
    assert report["auroc_entropy"] == ev.auroc(ev.entropy(bma), ev.entropy(ev.bayes_average(ood)))
    assert report["num_draws"] == 4 and report["num_points"] == 50
    # a predictive given directly
    direct = ev.classification_report(bma, y, num_bins=10)
    assert direct["num_draws"] is None and direct["ece"] == report["ece"]
    assert "agreement" not in direct


def test_drawing_leaves_the_users_matplotlib_alone(tmp_path):
    """A user's backend and pyplot state are theirs: our figures are drawn without pyplot."""
    import subprocess
    import sys

    code = ("import sys, matplotlib; matplotlib.use('svg')\n"
            "import numpy as np; from fedmcmc import evaluation\n"
            "p = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]); y = np.array([0, 1, 1])\n"
            f"evaluation.plot_reliability({str(tmp_path / 'r.png')!r}, {{'m': (p, y)}}, num_bins=3)\n"
            "assert matplotlib.get_backend() == 'svg', matplotlib.get_backend()\n"
            "assert 'matplotlib.pyplot' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "r.png").stat().st_size > 0
