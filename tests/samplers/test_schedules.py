"""FA-HMC's dynamic step (Proposition 4.5): the schedule, its first stage, its Langevin time, and
the law of the chain it drives, against the exact recursion of the discretised chain."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc import simulate
from fedmcmc.evaluation.laws import fa_hmc_round_map
from fedmcmc.samplers import fa_hmc, schedules
from test_fa_hmc import DATA, DIM, LAM, MODEL, MU, W


def test_the_step_drops_by_sqrt_2_as_each_stage_doubles():
    schedule = schedules.doubling_stages(0.4, 5)
    stages = [0] * 5 + [1] * 10 + [2] * 20 + [3]  # t_1 = 5, t_2 = 10, t_3 = 20
    expected = np.float32(0.4) * np.sqrt(2.0) ** -np.asarray(stages, np.float64)
    got = jax.jit(jax.vmap(schedule))(jnp.arange(len(stages)))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert float(schedule(35)) == float(got[-1])  # a Python int counter, as on static loops


def test_first_stage_contracts_eightfold_and_is_whole_rounds():
    mu, eta, k = 0.5, 0.1, 4
    t1 = schedules.first_stage(mu, eta, k)
    rate = mu * (k * eta) ** 2 / 4
    assert (1 - rate) ** t1 <= 1 / 8 < (1 - rate) ** (t1 - 1)
    assert schedules.first_stage(mu, eta, k, per_round=3) == 3 * int(np.ceil(t1 / 3))
    assert schedules.first_stage(mu, eta, k, per_round=2.5) == t1  # a round is no whole number of trajectories
    with pytest.raises(ValueError, match="mu"):
        schedules.first_stage(-1.0, eta, k)


@pytest.mark.parametrize("per_round", [3.0, 0.6, 1.0])
def test_decayed_rounds_sum_the_squared_step_ratios(per_round):
    first, rounds = 4, 200
    eta = schedules.doubling_stages(1.0, first)
    ratios = np.asarray([float(eta(int(np.floor(k * per_round)))) ** 2 for k in range(rounds)])
    for start, stop in [(0, rounds), (17, 150), (60, 61)]:
        np.testing.assert_allclose(schedules.decayed_rounds(first, per_round, start, stop),
                                   ratios[start:stop].sum(), rtol=1e-6)


@pytest.mark.slow
def test_transient_law_with_the_dynamic_step_matches_the_exact_recursion():
    """Algorithm 3's clock, K = 8, T = 3 trajectories a round, t_1 = 6 trajectories: rounds 1-2 at
    eta, 3-6 at eta / sqrt(2), 7-14 at eta / 2; three heterogeneous clients, noisy gradients."""
    eta, k, t, first, rounds, sigma = 0.1, 8, 3, 6, 12, 1.0
    sampler = fa_hmc(MODEL, W, eta, k, t, gradient_noise=sigma, clock="trajectory", step_decay=first)
    samples = simulate(11, sampler, DATA, jnp.full(DIM, 8.0), rounds, num_chains=250).samples
    schedule = schedules.doubling_stages(eta, first)
    n = len(W)
    m = np.zeros(fa_hmc_round_map(LAM, MU, W, eta, k, t, 0.0, sigma, clock="trajectory").A.shape[0])
    m[:n] = 8.0
    cov = np.zeros((m.size, m.size))
    read = np.zeros(m.size)
    read[:n] = W
    for r in range(1, rounds + 1):
        step = float(schedule((r - 1) * t))
        M = fa_hmc_round_map(LAM, MU, W, step, k, t, 0.0, sigma, clock="trajectory")
        m, cov = M.A @ m + M.b, M.A @ cov @ M.A.T + M.Q
        if r in (1, 2, 5, 12):
            x = samples[:, r - 1, :].reshape(-1).astype(np.float64)
            h.assert_close(x, read @ m, f"mean, round {r}")
            h.assert_close((x - read @ m) ** 2, read @ cov @ read, f"variance, round {r}")


def test_step_decay_needs_a_constant_step():
    with pytest.raises(ValueError, match="constant step_size"):
        fa_hmc(MODEL, W, lambda j: 0.1, 8, 3, clock="trajectory", step_decay=6)
    with pytest.raises(ValueError, match="step_decay"):
        fa_hmc(MODEL, W, 0.1, 8, 3, clock="trajectory", step_decay=0)
