"""Partitioners, the SYNTHETIC(alpha, beta) generator and partition summaries."""

import json

import numpy as np
import pytest

from fedmcmc.data import partition as P


def _labels(seed=0, n=6000, k=10):
    return np.random.default_rng(seed).integers(0, k, n)


def _assert_disjoint(parts, n, covering):
    flat = np.concatenate(parts)
    assert np.unique(flat).size == flat.size, "a point is held by two clients"
    assert flat.min() >= 0 and flat.max() < n
    if covering:
        assert flat.size == n
    for p in parts:
        assert p.dtype == np.int64 and np.all(np.diff(p) > 0)


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(p, q) for p, q in zip(a, b))


def test_iid_covers_evenly_and_is_reproducible():
    parts = P.iid(3, 1003, 10)
    _assert_disjoint(parts, 1003, covering=True)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert _same(parts, P.iid(3, 1003, 10)) and not _same(parts, P.iid(4, 1003, 10))
    with pytest.raises(ValueError, match="num_clients"):
        P.iid(0, 5, 6)


def test_unbalanced_sizes_follow_sigma():
    parts = P.unbalanced(0, 100, 50, sigma=3.0)  # very unequal shares, still >= 1 point each
    _assert_disjoint(parts, 100, covering=True)
    assert min(len(p) for p in parts) >= 1
    assert [len(p) for p in P.unbalanced(0, 1000, 10, 0.0)] == [100] * 10
    assert _same(P.unbalanced(5, 500, 8, 1.0), P.unbalanced(5, 500, 8, 1.0))

    def cv(sigma):  # coefficient of variation of sizes, averaged over seeds
        sizes = [np.array([len(p) for p in P.unbalanced(s, 20_000, 40, sigma)]) for s in range(10)]
        return np.mean([s.std() / s.mean() for s in sizes])

    # lognormal shares have CV sqrt(exp(sigma^2) - 1): 0.53 for sigma 0.5, 1.31 for sigma 1
    assert cv(0.0) < 0.01 < cv(0.5) < cv(1.0)
    assert 0.35 < cv(0.5) < 0.7
    with pytest.raises(ValueError, match="sigma"):
        P.unbalanced(0, 10, 2, -1.0)


def test_dirichlet_covers_and_skew_falls_as_alpha_grows():
    labels = _labels()
    parts = P.dirichlet(0, labels, 20, 0.5)
    _assert_disjoint(parts, labels.size, covering=True)
    assert _same(parts, P.dirichlet(0, labels, 20, 0.5))
    assert min(len(p) for p in P.dirichlet(1, labels, 20, 0.1, min_size=20)) >= 20
    alphas = (0.05, 0.5, 5.0, 50.0)
    for seed in range(3):
        skew = [P.label_skew(P.label_counts(labels, P.dirichlet(seed, labels, 20, a))) for a in alphas]
        assert all(s1 > s2 for s1, s2 in zip(skew, skew[1:])), skew
        assert skew[0] > 0.6  # near one class per client
        # IID deal for reference: only multinomial noise (about 0.07 here)
        assert skew[-1] < 2 * P.label_skew(P.label_counts(labels, P.iid(seed, labels.size, 20)))
    with pytest.raises(ValueError, match="alpha"):
        P.dirichlet(0, labels, 20, 0.0)
    with pytest.raises(ValueError, match="larger alpha"):
        P.dirichlet(0, labels[:100], 20, 0.01, min_size=5, max_tries=5)


def test_dominant_label_fractions_are_exact():
    k = 10
    sizes_by_label = 500 + 37 * np.arange(k)  # unequal pools, so shares are checked per label
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(k), sizes_by_label))
    for clients in (10, 20):
        parts = P.dominant_label(7, labels, clients, dominant=0.4, other=0.01)
        _assert_disjoint(parts, labels.size, covering=False)
        counts = P.label_counts(labels, parts, k)
        for c in range(clients):
            for lab in range(k):
                share = 0.4 if lab == c % k else 0.01
                assert counts[c, lab] == int(np.floor(share * sizes_by_label[lab] + 1e-9))
    # shares that sum to exactly 1 are allowed, and need the floor guard (0.29 * 100 = 28.999...)
    tiny = np.repeat([0, 1], 100)
    counts = P.label_counts(tiny, P.dominant_label(0, tiny, 2, dominant=0.71, other=0.29))
    assert counts.tolist() == [[71, 29], [29, 71]]
    with pytest.raises(ValueError, match="> 1 of its points"):
        P.dominant_label(0, labels, 30)  # 3 clients x 40% of each label
    with pytest.raises(ValueError, match="no points"):
        P.dominant_label(0, np.repeat([0, 1], 10), 2, dominant=0.01, other=0.01)


def _beta_moments(a, b):
    m = a / (a + b)
    v = a * b / ((a + b) ** 2 * (a + b + 1))
    excess_kurtosis = 6 * ((a - b) ** 2 * (a + b + 1) - a * b * (a + b + 2)) / (a * b * (a + b + 2) * (a + b + 3))
    return m, v, excess_kurtosis


@pytest.mark.parametrize("a,b", [(100.0, 100.0), (0.5, 0.5), (2.0, 5.0)])
def test_beta_binary_shares_match_beta_moments(a, b):
    """Tolerances: J clients give J independent shares q_c = rint(p_c m) / m. The sample mean
    has standard error sqrt(Var p / J); the sample variance has standard error
    Var p * sqrt((kurt_excess + 2) / J) (the large-J variance of s^2 is (mu_4 - sigma^4) / J).
    Rounding adds about 1 / (12 m^2) to the variance (Sheppard's correction), added to the
    target. We accept 4 standard errors (a two-sided normal tail of 6e-5 per check)."""
    clients, size = 1000, 100
    labels = np.random.default_rng(0).permutation(np.repeat([0, 1], clients * size))
    parts = P.beta_binary(11, labels, clients, a, b, size=size)
    _assert_disjoint(parts, labels.size, covering=False)
    assert {len(p) for p in parts} == {size}
    share = np.array([labels[p].mean() for p in parts])
    mean, var, kurt = _beta_moments(a, b)
    var_q = var + 1 / (12 * size**2)
    assert abs(share.mean() - mean) < 4 * np.sqrt(var / clients)
    assert abs(share.var(ddof=1) - var_q) < 4 * var * np.sqrt((kurt + 2) / clients)


def test_beta_binary_defaults_and_errors():
    labels = np.random.default_rng(2).permutation(np.r_[np.zeros(300, int), np.ones(200, int)])
    parts = P.beta_binary(0, labels, 10, 0.5, 0.5)
    assert {len(p) for p in parts} == {20}  # min(300, 200) // 10 always fits
    near = P.label_skew(P.label_counts(labels, P.beta_binary(0, labels, 10, 100, 100)))
    far = P.label_skew(P.label_counts(labels, parts))
    assert far > 2 * near
    assert _same(parts, P.beta_binary(0, labels, 10, 0.5, 0.5))
    with pytest.raises(ValueError, match="smaller size"):
        P.beta_binary(0, labels, 10, 50, 0.5, size=40)  # needs ~400 ones, has 200
    with pytest.raises(ValueError, match="0, 1"):
        P.beta_binary(0, np.arange(3), 1, 1, 1)


def test_synthetic_fedprox_defaults_and_qlsd_shape():
    clients = P.synthetic(0, 1.0, 1.0)
    assert len(clients) == 30
    for x, y in clients:
        assert x.dtype == np.float32 and y.dtype == np.int32
        assert x.shape == (len(y), 60) and len(y) >= 50
        assert y.min() >= 0 and y.max() < 10
    qlsd = P.synthetic(1, 1.0, 1.0, num_clients=50, dim=2, num_classes=2)
    assert len(qlsd) == 50 and all(x.shape[1] == 2 for x, _ in qlsd)
    assert set(np.concatenate([y for _, y in qlsd]).tolist()) == {0, 1}
    again = P.synthetic(1, 1.0, 1.0, num_clients=50, dim=2, num_classes=2)
    assert all(np.array_equal(x1, x2) and np.array_equal(y1, y2) for (x1, y1), (x2, y2) in zip(qlsd, again))
    other = P.synthetic(2, 1.0, 1.0, num_clients=50, dim=2, num_classes=2)
    assert not np.array_equal(qlsd[0][0][:5], other[0][0][:5])
    fixed = P.synthetic(0, 0.5, 0.5, num_clients=4, sizes=[5, 6, 7, 8])
    assert [len(y) for _, y in fixed] == [5, 6, 7, 8]
    iid = P.synthetic(0, 0.0, 0.0, num_clients=20, sizes=2000, iid=True)
    non_iid = P.synthetic(0, 0.0, 0.0, num_clients=20, sizes=2000)
    assert P.label_skew([np.bincount(y, minlength=10) for _, y in iid]) < 0.05
    assert P.label_skew([np.bincount(y, minlength=10) for _, y in non_iid]) > 0.5  # own W_k per client
    with pytest.raises(ValueError, match="num_classes"):
        P.synthetic(0, 1, 1, num_classes=1)


def test_synthetic_beta_moves_inputs_and_alpha_leaves_the_data_unchanged():
    def between_client_variance(beta):
        clients = P.synthetic(3, 0.0, beta, num_clients=200, dim=5, sizes=200)
        means = np.stack([x.mean(axis=0) for x, _ in clients])  # ~ v_k + N(0, Sigma / 200)
        return means.var(axis=0, ddof=1).mean()

    # Var v_kj = beta^2 + 1 (+ Sigma_jj / 200 <= 0.005). Standard errors of the estimate
    # (200 clients): ~sqrt(2/199) / sqrt(5) = 0.045 for beta = 0 (independent coordinates;
    # 0.051 measured over 30 seeds), ~10 sqrt(2/199) = 1.0 for beta = 3 (the shared B_k
    # dominates; 0.90 measured); 4 of them accepted.
    assert abs(between_client_variance(0.0) - 1.0) < 4 * 0.05
    assert abs(between_client_variance(3.0) - 10.0) < 4 * 1.0

    # FedProx's alpha shifts all class logits alike: the data are the same for any alpha
    a0 = P.synthetic(5, 0.0, 1.0, num_clients=10)
    a3 = P.synthetic(5, 3.0, 1.0, num_clients=10)
    for (x0, y0), (x3, y3) in zip(a0, a3):
        assert np.array_equal(x0, x3) and np.array_equal(y0, y3)


def test_counts_summary_federate_and_plot(tmp_path):
    labels = _labels(n=600, k=4)
    parts = P.dirichlet(0, labels, 6, 0.3)
    counts = P.label_counts(labels, parts)
    assert counts.shape == (6, 4) and counts.sum() == 600
    np.testing.assert_array_equal(counts.sum(axis=0), np.bincount(labels))
    s = P.summary(labels, parts)
    json.dumps(s)
    assert s["disjoint"] and s["num_points"] == 600 and s["sizes"] == [len(p) for p in parts]
    assert s["labels_per_client_mean"] == pytest.approx((counts > 0).sum(axis=1).mean())
    assert P.label_skew(np.tile(np.bincount(labels), (3, 1))) == pytest.approx(0.0)
    assert P.label_skew(np.eye(4)) == pytest.approx(0.75)

    x = np.random.default_rng(0).normal(size=(600, 3))
    data = P.federate(x, labels, parts)
    assert data.num_clients == 6 and data.total == 600
    np.testing.assert_array_equal(data.counts, [len(p) for p in parts])
    cx, cy = data.unpadded(2)
    np.testing.assert_allclose(cx, x[parts[2]].astype(np.float32))
    np.testing.assert_array_equal(cy, labels[parts[2]])

    for clients in (6, 150):  # stacked bars, then heatmap
        path = P.plot_partition(tmp_path / f"p{clients}.png", np.ones((clients, 4)), title="t")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="matrix"):
        P.plot_partition(tmp_path / "bad.png", np.ones(4))
