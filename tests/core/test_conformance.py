"""What every registered sampler owes the runtimes, checked over the catalog and the registry.

Over the catalog (:mod:`catalog`, every sampler and surrogate kind on real data): the bits a
client reports (``ClientInfo.bits``) must be the length of the message that the wire layer
actually writes for its upload (``fedmcmc.runtime.messaging.wire.encode_upload``), in the setup
exchange and in a round; a sampler that counts otherwise misreports its communication cost in
both runtimes. The centralised baselines (SGLD and pSGLD on the pooled data) communicate nothing
and report 0.

Over the registry (``fedmcmc.samplers.REGISTRY``, each sampler from a run config that the
registry generates): the server and clients of the message runtime, without Flower, give the
simulator's samples, and a run killed and resumed gives the samples of an uninterrupted one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from catalog import NAMES, breast_cancer, samplers
from fedmcmc.app import config
from fedmcmc.core import xla
from fedmcmc.runtime import round as rnd
from fedmcmc.runtime import simulator
from fedmcmc.runtime.messaging.server import LocalTransport, ServerRuntime
from fedmcmc.runtime.messaging.wire import encode_upload, items
from fedmcmc.runtime.simulator import simulate
from fedmcmc.samplers import REGISTRY

DATA, MODEL = breast_cancer()
catalog = functools.cache(lambda: samplers(DATA, MODEL))  # built by the first test that needs it
CENTRALISED = {name for name, entry in REGISTRY.items() if entry.pooled}


def _encoded_bits(uploads, client: int) -> int:
    return encode_upload([jax.tree_util.tree_map(lambda a: np.asarray(a)[client], part)
                          for part in items(uploads)]).bits


def test_the_catalog_has_every_registered_sampler():
    assert all(any(key == name or key.startswith(name + "-") for key in NAMES) for name in REGISTRY)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NAMES))
def test_counted_bits_are_the_encoded_message_length(name):
    sampler, data = catalog()[name]
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())
    b = data.num_clients
    ids = jnp.arange(b, dtype=jnp.uint32)
    chain = rnd.chain_keys(0, [0])[0]
    theta0 = jnp.zeros(MODEL.dim, jnp.float32)

    @xla.jit  # as the runtimes compile a round (a fifth to a third faster to compile than plain jax.jit)
    def first_round():
        server_state, broadcast = rnd.server_init(sampler, chain, theta0, b)
        states = rnd.client_init(sampler, chain, broadcast, clients, ids)
        setup = None
        if sampler.setup is not None:
            states, setup_up, setup_info = rnd.setup_clients(sampler, chain, states, broadcast, clients, ids, b)
            setup = (setup_up, setup_info.bits)
        _, uploads, infos = rnd.client_round(sampler, chain, 0, states, broadcast, clients, ids, jnp.ones(b, bool))
        return setup, uploads, infos.bits

    setup, uploads, bits = first_round()
    if name in CENTRALISED:
        assert b == 1 and int(bits[0]) == 0 and setup is None
        return
    for i in range(b):
        assert _encoded_bits(uploads, i) == int(bits[i]), f"client {i} of {name}"
        if setup is not None:
            assert _encoded_bits(setup[0], i) == int(setup[1][i]), f"setup upload of client {i} of {name}"


# ---- every registered sampler, from a config generated from the registry ----

#: One example value per ``[sampler]`` key (not per sampler): a sampler's test config sets
#: every key it takes that is listed here; every required key must be.
EXAMPLES = {
    "step_size": 1e-3, "batch_size": 4, "compression": "{ bits = 4 }",
    "participation": '{ p = 0.7, scaling = "inverse_probability" }', "refresh_every": 2,
    "num_leapfrog": 3, "local_steps": 4, "clock": '"leapfrog"', "correlation": 0.5, "debiased": "true",
    "momentum_sync": '"average"', "record_every": 2, "shard_probs": '"size"', "rho": 0.5, "num_local_steps": 2,
}
ROUNDS, CHUNK = 4, 2


def run_config(name: str) -> str:
    """A small fixed run of a registered sampler: 3 clients in 3 dimensions, 4 rounds, 5 chains: two
    blocks of 3, the last padded (:func:`fedmcmc.runtime.round.block_width`), in every runtime."""
    keys = config.sampler_keys(name)
    missing = [key for key, required in keys.items() if required and key not in EXAMPLES]
    assert not missing, f"{name} needs {missing}: add an example value to EXAMPLES"
    sampler = "".join(f"{key} = {EXAMPLES[key]}\n" for key in keys if key in EXAMPLES)
    return (f'[problem]\nname = "heterogeneous-gaussian"\nnum_clients = 3\ndim = 3\nmin_size = 10\nmax_size = 30\n'
            f'[sampler]\nname = "{name}"\n{sampler}'
            f"[run]\nseed = 4\nnum_chains = 5\nnum_iterations = {ROUNDS}\nchunk_size = {CHUNK}\n")


#: ``config.from_text``, built once per config for the simulator, the server and the clients.
build = functools.cache(config.from_text)


@functools.cache
def reference(name: str):
    """The config's run in the simulator: ``(text, cfg, built, result)``."""
    text = run_config(name)
    cfg, built = build(text)
    return text, cfg, built, _simulate(cfg, built)


def _simulate(cfg, built, **kwargs):
    r = cfg["run"]
    return simulate(r["seed"], built.sampler, built.data, np.zeros(built.model.dim), r["num_iterations"],
                    num_chains=r["num_chains"], chunk_size=r["chunk_size"], **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REGISTRY))
def test_flower_runtime_gives_the_simulators_samples(name, tmp_path):
    """The server and its clients without Flower (``LocalTransport``) give the simulator's
    samples and bits, bit for bit."""
    text, _, _, ref = reference(name)
    server = ServerRuntime(text, tmp_path, build)
    res = server.run(LocalTransport(text, server.b, build))
    np.testing.assert_array_equal(res.samples, ref.samples)
    assert not np.array_equal(res.samples[:, :1], res.samples[:, -1:])  # the chains moved
    if not REGISTRY[name].pooled:  # a pooled baseline counts no communication; on Flower its upload travels
        np.testing.assert_array_equal(res.total_bits_up, ref.total_bits_up)
        assert server.stats["wire_bits_mismatch"] == 0
    np.testing.assert_array_equal(res.setup_bits_up, ref.setup_bits_up)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REGISTRY))
def test_a_resumed_run_equals_an_uninterrupted_one(name, tmp_path, monkeypatch):
    """Killed after its second chunk's draws but before its checkpoint, the run resumes from the
    first chunk and gives the uninterrupted run's samples and counts."""
    _, cfg, built, ref = reference(name)
    real_save, calls = simulator.save_npz, []

    def crash_before_the_second_checkpoint(path, **arrays):
        real_save(path, **arrays)
        calls.append(path)
        if len(calls) == 3:  # chunk 0, its checkpoint, chunk 1
            raise KeyboardInterrupt

    monkeypatch.setattr(simulator, "save_npz", crash_before_the_second_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        _simulate(cfg, built, out_dir=tmp_path)
    monkeypatch.setattr(simulator, "save_npz", real_save)
    resumed = _simulate(cfg, built, out_dir=tmp_path, resume=True)
    for field in ("samples", "bits_up", "bits_down", "active", "total_bits_up", "setup_bits_up"):
        np.testing.assert_array_equal(getattr(resumed, field), getattr(ref, field), err_msg=field)
