"""An empirical membership-inference check: on a small logistic regression, an attacker who sees
SGLD's last draw and must tell the data set with a canary record from the one where the canary is
replaced does no better than the accounted (epsilon, delta) allows, TPR <= e^eps FPR + delta at
every threshold (up to Monte-Carlo error), while it does detect the canary."""

import math

import numpy as np
import pytest

from fedmcmc.data.federated import from_clients
from fedmcmc.models import clipped_gradients, logistic_regression
from fedmcmc.privacy import Setting, account
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers import sgld

STEP, ROUNDS, CLIP, DELTA, CHAINS = 0.05, 4, 1.0, 1e-5, 4000


def last_draws(canary_x, seed):
    rng = np.random.default_rng(0)  # the same nine other records in both data sets
    x = np.vstack([rng.normal(size=(9, 2)), canary_x]).astype(np.float32)
    y = np.array([0, 1, 0, 1, 1, 0, 1, 0, 1, 1], np.int32)
    model = clipped_gradients(logistic_regression(2), CLIP)
    res = simulate(seed, sgld(model, STEP), from_clients([(x, y)]), np.zeros(2), ROUNDS, num_chains=CHAINS)
    return np.asarray(res.samples[:, -1] @ np.ones(2))  # the attacker's score: along the canary


@pytest.mark.slow
def test_attack_advantage_stays_within_the_accounted_bound():
    eps = account("sgld", Setting(STEP, ROUNDS, None, CLIP, (10,), None, (1.0,), "full", False), DELTA)
    eps = eps["record"]["epsilon"]
    assert 1.0 < eps < 6.0
    with_canary, without = last_draws([[4.0, 4.0]], seed=1), last_draws([[-4.0, -4.0]], seed=2)
    thresholds = np.quantile(np.concatenate([with_canary, without]), np.linspace(0.02, 0.98, 25))
    tpr = (with_canary[:, None] > thresholds).mean(axis=0)
    fpr = (without[:, None] > thresholds).mean(axis=0)
    assert np.max(tpr - fpr) > 0.1  # the attack sees the canary
    for a, b in ((tpr, fpr), (1 - fpr, 1 - tpr)):  # both directions of (eps, delta)-DP
        se = np.sqrt(a * (1 - a) / CHAINS + math.exp(2 * eps) * b * (1 - b) / CHAINS)
        assert np.all(a <= math.exp(eps) * b + DELTA + 4 * se)
    # the largest empirical epsilon over thresholds with FPR away from 0 stays below the bound
    usable = (fpr > 0.05) & (tpr > 0.05)
    assert np.max(np.log(tpr[usable] / fpr[usable])) < eps
