"""Shared statistical harness: small heterogeneous Gaussian problems with exact answers.

Model: x_ij ~ N(theta, I_d), flat prior, so U(theta) = (N / 2) ||theta - xbar||^2 + const and
every sampler below has a linear drift -gamma N (theta - xbar) plus zero-mean noise xi(theta).
For such a chain the stationary mean is exactly xbar, and per coordinate

    (1 - (1 - gamma N)^2) Var = 2 gamma + gamma^2 E_pi[Var(xi | theta)],

which gives the stationary variance in closed form for each noise we know exactly
(minibatches without replacement, partial participation) and an identity that can be
checked from the samples for compression noise.

Tolerances: chains are independent, so each chain's time average is one independent
draw of an estimator; the standard error is the standard deviation across chains over
sqrt(num_chains). Tests use Z = 5 standard errors: a false alarm has probability < 1e-6
per comparison, while a wrong scaling (a factor b, a missing 1/p_i) shifts the estimates by
tens of standard errors.
"""

from __future__ import annotations

import numpy as np

from fedmcmc.data.federated import FederatedData, from_clients
from fedmcmc.models.gaussian import gaussian_mean
from fedmcmc.runtime.simulator import simulate

Z = 5.0


def problem(sizes=(20, 35, 50, 80), dim=3, spread=3.0, seed=0) -> FederatedData:
    rng = np.random.default_rng(seed)
    return from_clients([rng.normal(rng.normal(0, spread, dim), 1.0, size=(n, dim)) for n in sizes])


def model_for(data: FederatedData):
    return gaussian_mean(data.x.shape[-1])


def client_arrays(data: FederatedData):
    return [np.asarray(data.unpadded(i), np.float64) for i in range(data.num_clients)]


def xbar(data: FederatedData) -> np.ndarray:
    return np.concatenate(client_arrays(data)).mean(axis=0)


def contraction(gamma: float, n_total: int) -> float:
    """1 - (1 - gamma N)^2."""
    return 1.0 - (1.0 - gamma * n_total) ** 2


def ula_variance(gamma: float, n_total: int) -> float:
    return 2 * gamma / contraction(gamma, n_total)


def minibatch_noise(data: FederatedData, batch: np.ndarray) -> np.ndarray:
    """Per-coordinate variance of sum_i (N_i / n_i) sum_{S_i} x_ij (without replacement)."""
    out = 0.0
    for x, n in zip(client_arrays(data), batch):
        big_n = x.shape[0]
        n = min(int(n), big_n)
        out = out + big_n**2 * (1 - n / big_n) * x.var(axis=0, ddof=1) / n
    return out


def minibatch_variance(gamma: float, data: FederatedData, batch) -> np.ndarray:
    return (2 * gamma + gamma**2 * minibatch_noise(data, np.asarray(batch))) / contraction(gamma, data.total)


def inverse_probability_variance(gamma: float, data: FederatedData, p: np.ndarray) -> np.ndarray:
    """Full local gradients g_i = N_i (theta - xbar_i), aggregated as sum_{i in A} g_i / p_i."""
    mu = xbar(data)
    c = np.array([(1 - pi) / pi * x.shape[0] ** 2 for x, pi in zip(client_arrays(data), p)])
    delta2 = np.stack([(mu - x.mean(axis=0)) ** 2 for x in client_arrays(data)])  # [b, d]
    return (2 * gamma + gamma**2 * (c[:, None] * delta2).sum(axis=0)) / (contraction(gamma, data.total) - gamma**2 * c.sum())


def active_scaling_variance(gamma: float, data: FederatedData, p: float) -> np.ndarray:
    """Full local gradients aggregated as (b / |A|) sum_{i in A} g_i with equal p, pausing on
    empty rounds: given |A| = a the active set is a uniform a-subset, so the noise variance
    is b^2 (1 - a / b) S_g^2 / a with S_g^2 the across-client sample variance of g_i."""
    from scipy import stats

    arrays = client_arrays(data)
    b = len(arrays)
    sizes = np.array([x.shape[0] for x in arrays], float)
    means = np.stack([x.mean(axis=0) for x in arrays])
    mu = xbar(data)
    a = np.arange(1, b + 1)
    pa = stats.binom.pmf(a, b, p)
    factor = np.sum(pa * b**2 * (1 - a / b) / a) / pa.sum()  # E[. | a >= 1]
    alpha = sizes - sizes.mean()  # g_ik - gbar_k = alpha_i theta_k - beta_ik
    beta = sizes[:, None] * means - (sizes[:, None] * means).mean(axis=0)
    # E[(alpha theta - beta)^2] = alpha^2 v + (alpha mu - beta)^2, averaged with 1 / (b - 1)
    slope = factor * np.sum(alpha**2) / (b - 1)
    offset = factor * np.sum((alpha[:, None] * mu - beta) ** 2, axis=0) / (b - 1)
    return (2 * gamma + gamma**2 * offset) / (contraction(gamma, data.total) - gamma**2 * slope)


def run(sampler, data, chains=1000, iterations=400, burn_in=100, seed=0):
    """Samples ``[chain, draw, d]`` of independent chains started at the posterior mean."""
    return simulate(seed, sampler, data, xbar(data), iterations, num_chains=chains, burn_in=burn_in).samples


def chain_moments(samples: np.ndarray, mu: np.ndarray):
    """Per-chain time averages of theta and (theta - mu)^2: [chains, d] each."""
    s = samples.astype(np.float64)
    return s.mean(axis=1), ((s - mu) ** 2).mean(axis=1)


def assert_close(estimates: np.ndarray, target, what: str):
    """Check the across-chain mean of ``estimates[chain, ...]`` against ``target`` within Z s.e."""
    m = estimates.mean(axis=0)
    se = estimates.std(axis=0, ddof=1) / np.sqrt(estimates.shape[0])
    gap = np.abs(m - target)
    assert np.all(gap <= Z * se), f"{what}: estimate {m} vs exact {target} (s.e. {se}, gap/se {gap / se})"
    return m, se


def check_gaussian(samples: np.ndarray, mean: np.ndarray, var, what: str):
    """Stationary mean and per-coordinate variance of ``samples[chain, draw, d]``."""
    means, sq = chain_moments(samples, mean)
    assert_close(means, mean, f"{what} mean")
    assert_close(sq, np.broadcast_to(var, mean.shape), f"{what} variance")
