"""What every registered sampler owes the runtimes, checked over the whole catalog.

The bits a client reports (``ClientInfo.bits``) must be the length of the message that the
wire layer actually writes for its upload (``fedmcmc.runtime.flower.wire.encode_upload``), in the
setup exchange and in a round; a sampler that counts otherwise misreports its
communication cost in both runtimes. The centralised baselines (SGLD and pSGLD on the pooled
data) communicate nothing and report 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from catalog import breast_cancer, samplers
from fedmcmc.runtime.flower.wire import encode_upload, items
from fedmcmc.runtime import round as rnd

DATA, MODEL = breast_cancer()
CATALOG = samplers(DATA, MODEL)
CENTRALISED = {"sgld", "psgld"}


def _encoded_bits(uploads, client: int) -> int:
    return encode_upload([jax.tree_util.tree_map(lambda a: np.asarray(a)[client], part)
                          for part in items(uploads)]).bits


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_counted_bits_are_the_encoded_message_length(name):
    sampler, data = CATALOG[name]
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())
    b = data.num_clients
    ids = jnp.arange(b, dtype=jnp.uint32)
    chain = rnd.chain_keys(0, [0])[0]
    theta0 = jnp.zeros(MODEL.dim, jnp.float32)

    @jax.jit
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
