"""QLSD++'s global anchor under partial participation: stale clients, bits, memory options, LSD++."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import harness as h
from fedmcmc.core.base import CLIENT_AXES
from fedmcmc.estimators import gradients
from fedmcmc.samplers import participation
from fedmcmc.core.base import Participation
from fedmcmc.compression import identity, quantization
from fedmcmc.samplers import lsd_pp, qlsd_pp
from fedmcmc.samplers.qlsd_pp import QLSDPPBroadcast
from fedmcmc.runtime.simulator import simulate

DATA = h.problem()
MODEL = h.model_for(DATA)
GAMMA = 0.5 / DATA.total
THETA0 = np.array([1.0, -2.0, 0.5], np.float32)
BATCH = np.array([3, 4, 5, 6])
L = 3


@pytest.mark.slow
def test_a_stale_client_refreshes_at_the_broadcast_anchor_and_a_fresh_one_keeps_its_own():
    sampler = qlsd_pp(MODEL, GAMMA, BATCH, identity(), participation.bernoulli(0.5), refresh_every=L)
    clients = DATA.clients()
    theta0 = jnp.asarray(THETA0)
    keys = jax.random.split(jax.random.PRNGKey(0), DATA.num_clients)
    states = jax.jit(jax.vmap(sampler.client_init, (0, None, CLIENT_AXES)))(keys, QLSDPPBroadcast(theta0, theta0), clients)
    exact0 = jax.jit(jax.vmap(lambda t, c: gradients.local_gradient(MODEL, t, c), (None, CLIENT_AXES)))(theta0, clients)
    np.testing.assert_array_equal(states.estimator.reference_grad, exact0)  # zeta_0 = theta_0 with its exact gradient
    np.testing.assert_array_equal(states.estimator.anchor_round, 0)

    # round 4: the anchor zeta_4 = theta_3 was set in round 3. Clients 0 and 1 were active then (a marker
    # gradient shows that they do not recompute it); clients 2 and 3 still hold the anchor of round 0.
    zeta, theta = jnp.asarray([0.3, 0.1, -0.2]), jnp.asarray([0.4, 0.0, -0.1])
    marker = jnp.full((DATA.num_clients, 3), 7.0)
    fresh = jnp.asarray([True, True, False, False])
    states = states._replace(estimator=states.estimator._replace(
        reference=jnp.where(fresh[:, None], zeta, states.estimator.reference),
        reference_grad=jnp.where(fresh[:, None], marker, states.estimator.reference_grad),
        anchor_round=jnp.where(fresh, 3, 0).astype(jnp.int32)))
    step = jax.jit(jax.vmap(sampler.client_step, (0, 0, None, CLIENT_AXES, None)))
    new, _, _ = step(keys, states, QLSDPPBroadcast(theta, zeta), clients, jnp.int32(4))
    new = new.estimator
    at_zeta = jax.vmap(lambda t, c: gradients.local_gradient(MODEL, t, c), (None, CLIENT_AXES))(zeta, clients)
    np.testing.assert_array_equal(new.reference, np.broadcast_to(zeta, (4, 3)))
    np.testing.assert_array_equal(new.anchor_round, 3)
    np.testing.assert_array_equal(new.reference_grad[:2], marker[:2])
    np.testing.assert_allclose(new.reference_grad[2:], at_zeta[2:], rtol=1e-6)

    # round 6 moves the anchor to theta_6: everyone refreshes at the broadcast position
    new, _, _ = step(keys, states, QLSDPPBroadcast(theta, theta), clients, jnp.int32(6))
    new = new.estimator
    np.testing.assert_array_equal(new.reference, np.broadcast_to(theta, (4, 3)))
    np.testing.assert_array_equal(new.anchor_round, 6)


def expected_bits_down(active, b, d, l):
    """The anchor travels in round k iff k is not a multiple of l and, since the anchor last moved,
    some round had an inactive client (for round 0: never, zeta_0 comes with client_init)."""
    out = np.zeros_like(active, dtype=np.int64)
    for c in range(active.shape[0]):
        synced = True
        for k in range(active.shape[1]):
            carried = (k % l != 0) and not synced
            out[c, k] = active[c, k] * 32 * d * (2 if carried else 1)
            synced = ((k + 1) % l != 0) and (active[c, k] == b or synced)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["full", "bernoulli"])
@pytest.mark.parametrize("batch", [None, BATCH])
def test_broadcast_bits_count_the_anchor_when_it_travels(scheme, batch):
    part = participation.full() if scheme == "full" else participation.bernoulli(0.7)
    res = simulate(0, qlsd_pp(MODEL, GAMMA, batch, quantization(4), part, refresh_every=L), DATA, THETA0, 30,
                   num_chains=3)
    d, b = MODEL.dim, DATA.num_clients
    if batch is None or scheme == "full":  # the anchor is never needed
        np.testing.assert_array_equal(res.bits_down, 32 * d * res.active)
    else:
        expected = expected_bits_down(np.asarray(res.active), b, d, L)
        np.testing.assert_array_equal(res.bits_down, expected)
        assert np.any(expected > 32 * d * res.active) and np.any(expected == 32 * d * res.active)


@pytest.mark.slow
def test_lsd_pp_is_qlsd_pp_with_the_identity_compressor_bit_for_bit():
    """Algorithm S3 is Algorithm 2 without compression, memory terms included."""
    part = participation.bernoulli(0.5, "inverse_probability")
    a = simulate(1, lsd_pp(MODEL, GAMMA, BATCH, part, refresh_every=L), DATA, THETA0, 40, num_chains=3)
    b = simulate(1, qlsd_pp(MODEL, GAMMA, BATCH, identity(), part, refresh_every=L), DATA, THETA0, 40, num_chains=3)
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.bits_up, b.bits_up)
    np.testing.assert_array_equal(a.bits_down, b.bits_down)


@pytest.mark.slow
def test_memory_updates_agree_under_full_participation():
    q = quantization(4)
    a = simulate(2, qlsd_pp(MODEL, GAMMA, BATCH, q, refresh_every=L), DATA, THETA0, 30, num_chains=2)
    b = simulate(2, qlsd_pp(MODEL, GAMMA, BATCH, q, refresh_every=L, memory_update="inverse_probability"),
                 DATA, THETA0, 30, num_chains=2)
    np.testing.assert_array_equal(a.samples, b.samples)  # p_i = 1: the same chain


@pytest.mark.slow
def test_memory_updates_differ_under_partial_participation_and_s45_needs_probabilities():
    q = quantization(4)
    part = participation.bernoulli([0.5, 0.6, 0.7, 0.8], "inverse_probability")
    c = simulate(2, qlsd_pp(MODEL, GAMMA, BATCH, q, part, refresh_every=L, memory_rate=0.3), DATA, THETA0, 30,
                 num_chains=2)
    d = simulate(2, qlsd_pp(MODEL, GAMMA, BATCH, q, part, refresh_every=L, memory_rate=0.3,
                            memory_update="inverse_probability"), DATA, THETA0, 30, num_chains=2)
    assert not np.array_equal(c.samples, d.samples)
    no_probs = Participation(part.sample, part.weights, name="custom")
    with pytest.raises(ValueError, match="no probabilities"):
        qlsd_pp(MODEL, GAMMA, BATCH, q, no_probs, memory_update="inverse_probability")
    with pytest.raises(ValueError, match="memory_update"):
        qlsd_pp(MODEL, GAMMA, BATCH, q, memory_update="S45")


@pytest.mark.slow
def test_s45_default_rate_is_the_algorithm_box_and_a_rate_past_its_bound_is_refused():
    """Under eq. S45 the default alpha_i = p_i / (omega_i + 1) applies 1 / (omega_i + 1) on active
    clients, the algorithm box's default chain bit for bit; a given alpha with
    alpha (omega + 1) / p_i > 1 (here LSD++'s alpha = 1 at p = 1/4, and QLSD++'s alpha = 1 / (omega + 1)
    at p_i < 1) is refused in one line naming the bound and the fix."""
    q = quantization(4)
    part = participation.bernoulli([0.25, 0.5, 0.6, 0.8], "inverse_probability")
    a = simulate(2, qlsd_pp(MODEL, GAMMA, BATCH, q, part, refresh_every=L), DATA, THETA0, 20, num_chains=2)
    b = simulate(2, qlsd_pp(MODEL, GAMMA, BATCH, q, part, refresh_every=L, memory_update="inverse_probability"),
                 DATA, THETA0, 20, num_chains=2)
    np.testing.assert_array_equal(a.samples, b.samples)
    omega = q.omega(MODEL.dim)
    with pytest.raises(ValueError, match=r"alpha \(omega \+ 1\) / p_i <= 1.*give memory_rate <= p_i / \(omega \+ 1\)"):
        lsd_pp(MODEL, GAMMA, BATCH, participation.bernoulli(0.25, "inverse_probability"), memory_rate=1.0,
               memory_update="inverse_probability")
    with pytest.raises(ValueError, match="S45"):
        qlsd_pp(MODEL, GAMMA, BATCH, q, part, memory_rate=1 / (omega + 1), memory_update="inverse_probability")
    qlsd_pp(MODEL, GAMMA, BATCH, q, part, memory_rate=0.25 / (omega + 1), memory_update="inverse_probability")
    qlsd_pp(MODEL, GAMMA, BATCH, q, part, memory_rate=1 / (omega + 1))  # the algorithm box has no 1 / p_i
