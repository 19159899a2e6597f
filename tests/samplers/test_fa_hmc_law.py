"""The exact law of an FA-HMC round on matrix-valued quadratic local potentials
(:mod:`fedmcmc.samplers.fa_hmc_law`): against the per-coordinate law the sampler is tested with
(:func:`fedmcmc.evaluation.laws.fa_hmc_law`), against a direct simulation of the recursion with
non-commuting curvatures, and the choice of ``num_leapfrog = "auto"`` through a run config."""

import numpy as np
import pytest

from fedmcmc.evaluation.laws import fa_hmc_law as coordinate_law
from fedmcmc.samplers import fa_hmc_law

LAM, MU, W = np.array([1.0, 0.25, 2.0]), np.array([4.0, -2.0, 1.0]), np.array([1.0, 2.0, 3.0]) / 6


@pytest.mark.parametrize("correlation", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("trajectories", [1, 3])
def test_isotropic_clients_give_the_per_coordinate_law(correlation, trajectories):
    eta, k, d = 0.1, 8, 2
    ref = coordinate_law(LAM, MU, W, eta, k, trajectories, correlation=correlation, clock="trajectory")
    hessians = LAM[:, None, None] * np.eye(d)
    gradients = -(LAM * MU)[:, None] * np.ones(d)  # grad f_c at the origin: lam_c (0 - mu_c)
    law = fa_hmc_law.round_law(hessians, gradients, W, eta, k, trajectories, correlation)
    np.testing.assert_allclose(law.mean, ref.mean[0], rtol=1e-9)
    np.testing.assert_allclose(np.diag(law.cov), ref.var[0], rtol=1e-9)
    np.testing.assert_allclose(law.cov[0, 1], 0.0, atol=1e-12)


def _leapfrog(a, g, x, p, eta, k):
    for _ in range(k):
        p = p - eta / 2 * (a @ x + g)
        x = x + eta * p
        p = p - eta / 2 * (a @ x + g)
    return x


def test_non_commuting_curvatures_match_a_direct_simulation():
    """Two clients whose Hessians do not commute, private and shared momenta: 40,000 chains of the
    round's recursion written as plain leapfrog loops, against the law's mean and covariance."""
    rng = np.random.default_rng(0)
    a = np.array([[[2.0, 0.8], [0.8, 0.6]], [[0.5, -0.3], [-0.3, 1.5]]])
    g = np.array([[0.7, -0.2], [-0.4, 0.5]])
    w, eta, k, rho, t = np.array([0.4, 0.6]), 0.35, 5, 0.5, 2
    law = fa_hmc_law.round_law(a, g, w, eta, k, t, rho)
    chains, rounds = 40000, 60
    x = np.zeros((chains, 2))
    for _ in range(rounds):
        ends = np.zeros_like(x)
        local = [x.copy() for _ in w]
        for _ in range(t):
            shared = rng.standard_normal(x.shape)
            for c in range(len(w)):
                p = np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.standard_normal(x.shape) / np.sqrt(w[c])
                local[c] = _leapfrog(a[c], g[c][:, None], local[c].T, p.T, eta, k).T
        for c in range(len(w)):
            ends += w[c] * local[c]
        x = ends
    se = np.sqrt(np.diag(law.cov) / chains)
    assert np.all(np.abs(x.mean(0) - law.mean) < 4 * se), (x.mean(0), law.mean)
    emp = np.cov(x.T)
    assert np.all(np.abs(emp - law.cov) < 4 * np.sqrt(2 / chains) * np.sqrt(np.outer(np.diag(law.cov),
                                                                                      np.diag(law.cov))))


def test_the_choice_keeps_the_tolerances_and_forgets_fastest():
    rng = np.random.default_rng(1)
    b = rng.standard_normal((3, 4, 4))
    a = np.einsum("cij,ckj->cik", b, b) / 4 + 0.3 * np.eye(4)
    w = np.array([0.2, 0.3, 0.5])
    h = np.einsum("c,cij->ij", w, a)
    g = rng.standard_normal((3, 4)) * 0.3
    g -= np.einsum("c,ci->i", w, g)  # the gradients at the mode average to zero
    choice = fa_hmc_law.choose(a, g, w, 1, 1.0, std_inflation=0.05, mean_offset=0.1)
    low, high = choice.law.sd_ratios
    assert 1 / 1.05 <= low and high <= 1.05 and choice.law.mean_offset <= 0.1
    slower = fa_hmc_law.round_law(a, g, w, choice.step_size / 2, choice.num_leapfrog, 1, 1.0)
    assert slower.autocorrelation_time > choice.law.autocorrelation_time
    assert np.all(np.linalg.eigvalsh(h) > 0)
    with pytest.raises(ValueError, match="too heterogeneous"):
        fa_hmc_law.choose(a, 50 * g, w, 8, 0.0, std_inflation=1e-4, mean_offset=1e-4)
