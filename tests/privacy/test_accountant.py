"""The accountant against closed forms and the package's reference numbers, its monotonicity,
and the mechanism mappings of the samplers (noise multipliers and refusals)."""

import math

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, stats

from fedmcmc.privacy import GaussianRounds, Setting, account, epsilon, smallest_noise
from fedmcmc.privacy.accountant import _accountant
from fedmcmc.privacy.mechanisms import MECHANISMS

DELTA = 1e-5


def analytic_gaussian_epsilon(z, delta):
    """Balle and Wang (2018), Theorem 8: the Gaussian mechanism of noise multiplier z is
    (eps, delta)-DP iff Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z) <= delta."""
    def excess(eps):
        return stats.norm.cdf(0.5 / z - eps * z) - math.exp(eps) * stats.norm.cdf(-0.5 / z - eps * z) - delta
    return optimize.brentq(excess, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize("z", [0.5, 1.0, 3.0])
def test_one_gaussian_mechanism_is_the_analytic_gaussian_mechanism(z):
    exact = analytic_gaussian_epsilon(z, DELTA)
    pld = epsilon(GaussianRounds(z, 1), DELTA, "pld")
    assert exact - 1e-9 <= pld <= exact + 2e-3  # the PLD's discretisation errs on the safe side
    assert epsilon(GaussianRounds(z, 1), DELTA, "rdp") >= exact  # RDP is an upper bound


@pytest.mark.parametrize("z,k", [(1.0, 10), (5.0, 100)])
def test_k_gaussians_compose_as_one_with_noise_z_over_root_k(z, k):
    """In RDP k Gaussians have k alpha / (2 z^2) at every order alpha (the accountant's epsilon is
    that curve's conversion); exactly, they are one Gaussian of noise multiplier z / sqrt(k)."""
    orders = rdp_privacy_accountant.DEFAULT_RDP_ORDERS
    by_hand, _ = rdp_privacy_accountant.compute_epsilon(orders, k * np.asarray(orders) / (2 * z**2), DELTA)
    assert epsilon(GaussianRounds(z, k), DELTA, "rdp") == pytest.approx(by_hand, rel=1e-12)
    exact = analytic_gaussian_epsilon(z / math.sqrt(k), DELTA)
    assert exact - 1e-9 <= epsilon(GaussianRounds(z, k), DELTA, "pld") <= exact + 2e-3


def test_reference_numbers():
    """The package's own example (its test of the RDP conversion: constant RDP 1.1 on orders
    2..32 gives epsilon 1.32783806176 at 1e-5), and Abadi et al.'s DP-SGD setting (q = 0.01,
    z = 4, 10,000 steps, delta = 1e-5), for which the moments accountant gives epsilon about 1.26."""
    eps, order = rdp_privacy_accountant.compute_epsilon(range(2, 33), [1.1] * 31, DELTA)
    assert eps == pytest.approx(1.32783806176) and order == 32
    dpsgd = epsilon(GaussianRounds(4.0, 10_000, "poisson", 0.01), DELTA)
    assert 1.0 < dpsgd < 1.3
    assert epsilon(GaussianRounds(4.0, 10_000, "poisson", 0.01), DELTA, "pld") < dpsgd  # PLD is tighter


def test_monotone_in_rounds_noise_and_sampling():
    base = GaussianRounds(1.0, 100, "poisson", 0.1)
    eps = epsilon(base, DELTA)
    assert epsilon(base._replace(rounds=200), DELTA) > eps
    assert epsilon(base._replace(noise_multiplier=2.0), DELTA) < eps
    assert epsilon(base._replace(rate=0.05), DELTA) < eps
    wor = GaussianRounds(1.0, 100, "without_replacement", 0.1, 10, 100)
    assert epsilon(wor._replace(size=5, rate=0.05), DELTA) < epsilon(wor, DELTA)
    assert epsilon(base._replace(noise_multiplier=math.inf), DELTA) == 0.0
    assert epsilon(base._replace(noise_multiplier=0.0), DELTA) == math.inf


def test_smallest_noise_meets_the_target_and_no_less():
    mechanism = GaussianRounds(1.0, 500, "poisson", 0.05)
    z = smallest_noise(mechanism, 2.0, DELTA)
    assert epsilon(mechanism._replace(noise_multiplier=z), DELTA) <= 2.0
    assert epsilon(mechanism._replace(noise_multiplier=z * 0.99), DELTA) > 2.0


def test_bad_input():
    with pytest.raises(ValueError, match="delta must lie in"):
        epsilon(GaussianRounds(1.0, 1), 0.0)
    with pytest.raises(ValueError, match="no sampling without replacement"):
        _accountant(GaussianRounds(1.0, 1, "without_replacement", 0.5, 1, 2), "pld")


SETTING = Setting(step_size=1e-4, rounds=300, clip=2.0, record_clip=None, counts=(100, 100, 50),
                  batch_sizes=(10,), probs=(1.0,), scaling="full", compressed=True)


def test_qlsd_sharp_client_level_is_the_gaussian_of_sqrt_2_over_gamma_over_w_c():
    z = math.sqrt(2 / SETTING.step_size) / SETTING.clip
    got = account("qlsd#", SETTING, DELTA)
    assert got["client"]["epsilon"] == pytest.approx(epsilon(GaussianRounds(z, 300), DELTA), rel=1e-12)
    # a replaced record moves one upload within C: the client's Gaussian with twice the sensitivity
    assert got["record"]["epsilon"] == pytest.approx(epsilon(GaussianRounds(z / 2, 300), DELTA), rel=1e-12)
    partial = SETTING._replace(probs=(0.5,), scaling="inverse_probability")
    poisson = GaussianRounds(z * 0.5, 300, "poisson", 0.5)  # weight 1 / p, rate p
    assert account("qlsd#", partial, DELTA)["client"]["epsilon"] == pytest.approx(epsilon(poisson, DELTA), rel=1e-12)


def test_qlsd_pp_without_memory_is_qlsd_sharp_and_with_memory_is_refused():
    """No memory: QLSD#'s rounds at the client level; the record level through C only (the SVRG
    anchor gradient holds every record, so no minibatch bound even with record_clip)."""
    sharp = account("qlsd#", SETTING, DELTA)
    for name, extra in (("qlsd++", {"memory": False}), ("lsd++", {"memory_rate": 0.0}),
                        ("qlsd++", {"memory_rate": [0.0, 0.0]})):
        got = account(name, SETTING._replace(record_clip=0.5, compressed=False, extra=extra), DELTA)
        assert got["client"]["epsilon"] == sharp["client"]["epsilon"]
        assert got["record"]["epsilon"] == sharp["record"]["epsilon"]  # z / 2, not the minibatch's
    for extra in ({}, {"memory_rate": 0.5}):
        assert "memory = false" in account("qlsd++", SETTING._replace(extra=extra), DELTA)["client"]["refused"]
    no_clip = account("qlsd++", SETTING._replace(clip=None, record_clip=0.5, extra={"memory": False}), DELTA)
    assert "bound records through [privacy] clip" in no_clip["record"]["refused"]


def test_record_level_uses_minibatch_sampling_without_compression():
    s = SETTING._replace(clip=None, record_clip=0.5, compressed=False)
    root = math.sqrt(2 / s.step_size)
    worst = max(epsilon(GaussianRounds(root * n / (2 * big * 0.5), 300, "without_replacement", n / big, n, big),
                        DELTA) for n, big in ((10, 100), (10, 50)))
    assert account("qlsd#", s, DELTA)["record"]["epsilon"] == pytest.approx(worst, rel=1e-12)
    assert "record_clip (uncompressed uploads) or clip" in account("qlsd#", s._replace(compressed=True),
                                                                    DELTA)["record"]["refused"]


def test_refusals_name_the_reason():
    got = account("qlsd#", SETTING._replace(clip=None), DELTA)
    assert got["client"] == {"refused": "no bound on a client's upload: set [privacy] clip"}
    active = account("qlsd#", SETTING._replace(probs=(0.5,), scaling="active"), DELTA)
    assert "inverse_probability" in active["client"]["refused"]
    assert "without noise" in account("qlsd*", SETTING, DELTA)["client"]["refused"]
    assert "no client to protect" in account("sgld", SETTING, DELTA)["client"]["refused"]
    assert "local_steps = 1" in account("fa-ld", SETTING._replace(extra={"local_steps": 5}), DELTA)["client"]["refused"]
    from fedmcmc.samplers import REGISTRY
    for entry in REGISTRY.values():  # every registered sampler is accounted or refused
        assert isinstance(entry.privacy, str) or entry.privacy.mechanism in MECHANISMS


def test_fa_ld_counts_only_the_other_clients_noise():
    w = np.array([0.5, 0.25, 0.25])
    s = SETTING._replace(step_size=0.01, scaling="full", extra={"weights": w, "local_steps": 1, "correlation": 0.5})
    z = 0.01 * np.sqrt(0.5 * (1 - w)) / (w * SETTING.clip)  # the shared half of the momenta does not count
    worst = max(epsilon(GaussianRounds(zi, 300), DELTA) for zi in z)
    assert account("fa-ld", s, DELTA)["client"]["epsilon"] == pytest.approx(worst, rel=1e-12)


def test_dsgld_counts_every_local_step_of_every_visit():
    f, h = np.array([0.25, 0.75]), 1e-3
    s = Setting(h, 20, None, 0.5, (40, 80), (8,), (1.0,), "full", False, {"probs": f, "local_steps": 5})
    record = max(epsilon(GaussianRounds(fs * 8 / (math.sqrt(h) * big * 0.5), 100, "without_replacement", 8 / big,
                                        8, big), DELTA) for fs, big in zip(f, (40, 80)))
    client = max(epsilon(GaussianRounds(fs / (math.sqrt(h) * big * 0.5), 100), DELTA) for fs, big in zip(f, (40, 80)))
    got = account("dsgld", s, DELTA)
    assert got["record"]["epsilon"] == pytest.approx(record, rel=1e-12)
    assert got["client"]["epsilon"] == pytest.approx(client, rel=1e-12)
    assert "record_clip" in account("dsgld", s._replace(record_clip=None), DELTA)["record"]["refused"]
