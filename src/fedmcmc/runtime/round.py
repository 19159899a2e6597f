"""One round of a federated sampler, and its key schedule: the one copy both runtimes call.

Keys (the same in every runtime, so that runs are reproducible bit for bit)::

    chain key   = fold_in(key(seed), chain)
    init key    = fold_in(chain key, 0)        client i: fold_in(init key, i); server: fold_in(init key, b)
    setup key   = fold_in(init key, b + 1)     client i: fold_in(setup key, i); server: fold_in(setup key, b)
    round key k = fold_in(chain key, k + 1)    client i: fold_in(round key, i); server: fold_in(round key, b)
    participation key = fold_in(round key, b + 1)

Every function here is for one chain; ``b`` is the number of clients, ``ids`` the indices of
the clients being run (all of them in the simulator, one in a Flower node), and the client
functions run those clients under ``vmap``. The simulator (:mod:`fedmcmc.runtime.simulator`) and the
message runtime (:mod:`fedmcmc.runtime.messaging`) add only what is theirs: chunks and chains, or
messages.

Chains (on CPU) are computed in blocks (:func:`block_width`, :func:`blockwise`): every program
of a run, in every runtime and process, computes the same consecutive chains at once, so that a
chain's numbers never depend on how many chains share its program or which process runs it.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import CLIENT_AXES, FederatedSampler
from fedmcmc.core.xla import fusion_barrier, materialize
from fedmcmc.runtime.devices import pad


#: The most chains one compiled program computes on CPU (:func:`block_width`).
BLOCK_CHAINS = 8


def block_width(num_chains: int) -> int:
    """Chains per program: a run's chains are computed in blocks of consecutive chains,
    ``[j w, (j + 1) w)`` with ``w`` this width (the last block padded with copies of its last
    chain), in every runtime and process (the simulator in one process or over workers, a
    Flower node, a Flower server). There are ``ceil(num_chains / BLOCK_CHAINS)`` blocks, and at
    least two from 4 chains on, so that a run of a few chains spreads over two cores.

    Why: XLA's CPU kernels for a dot product choose their blocking, hence the order in which
    they add, from the operands' shapes, and under ``vmap`` the chains are one of those
    dimensions; on an AVX2 CPU a logistic-regression gradient differed in its last bit
    between a program of 9 chains and the same chains in programs of 1 to 8, so a
    run split 2 + 3 over two workers did not give the draws of the same 5 chains in one program.
    With the blocks fixed by ``num_chains`` alone, every chain is computed by the same program
    wherever it runs.
    """
    blocks = max(-(-num_chains // BLOCK_CHAINS), 2 if num_chains >= 4 else 1)
    return -(-num_chains // blocks)


def blockwise(program, width: int, chain_args: int):
    """``program(*args)`` run on blocks of ``width`` chains (:func:`block_width`): ``program`` is
    vmapped over chains, its first ``chain_args`` arguments and all its outputs have the chains
    first, the other arguments are shared. The chains are cut into consecutive blocks of
    ``width`` from the first, the last padded with copies of its last chain; the outputs are
    put back together without the padding."""

    def run(*args):
        num_chains = jax.tree_util.tree_leaves(args[0])[0].shape[0]
        if num_chains == width:
            return program(*args)
        outs = []
        for start in range(0, num_chains, width):
            block = [jax.tree_util.tree_map(lambda a: pad(np.asarray(a)[start:start + width], width), x)
                     for x in args[:chain_args]]
            n = min(width, num_chains - start)
            outs.append(jax.tree_util.tree_map(lambda a: np.asarray(a)[:n], program(*block, *args[chain_args:])))
        return jax.tree_util.tree_map(lambda *parts: np.concatenate(parts), *outs)

    return run


def chain_keys(seed: int, chains) -> jax.Array:
    """``[len(chains), 2]`` keys of the chains with these global indices: ``fold_in(key(seed), c)``."""
    return jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(seed), jnp.asarray(chains, jnp.uint32))


def each(key, ids) -> jax.Array:
    """``fold_in(key, i)`` for every client index ``i`` of ``ids``: the clients' keys, materialised
    (:func:`fedmcmc.core.xla.materialize`): otherwise XLA fuses the hashes into every kernel that
    uses a key and recomputes them per element there (FA-HMC's init drew each client's momentum
    in one kernel of 1,200 instructions that took 3.6 s to compile, 0.6 s with stored keys)."""
    return materialize(jax.vmap(jax.random.fold_in, (None, 0))(key, ids))


def init_key(chain_key) -> jax.Array:
    return jax.random.fold_in(chain_key, 0)


def setup_key(chain_key, b: int) -> jax.Array:
    return jax.random.fold_in(init_key(chain_key), b + 1)


def round_key(chain_key, k) -> jax.Array:
    return jax.random.fold_in(chain_key, k + 1)


def select(mask, new, old):
    """``new`` where ``mask`` (leading axes) is true, else ``old``: inactive clients keep their state."""
    def pick(n, o):
        m = mask.reshape(mask.shape + (1,) * (n.ndim - mask.ndim))
        return jnp.where(m, n, o)

    return jax.tree_util.tree_map(pick, new, old)


def server_init(sampler: FederatedSampler, chain_key, theta0, b: int):
    """``(server_state, broadcast)`` of a chain before round 1."""
    return sampler.init(jax.random.fold_in(init_key(chain_key), b), theta0)


def client_init(sampler: FederatedSampler, chain_key, broadcast, clients, ids):
    """The states of clients ``ids`` before round 1."""
    return jax.vmap(sampler.client_init, (0, None, CLIENT_AXES))(each(init_key(chain_key), ids), broadcast, clients)


def setup_clients(sampler: FederatedSampler, chain_key, states, broadcast, clients, ids, b: int):
    """Clients ``ids``' side of the setup exchange: ``(states, uploads, infos)``."""
    setup = jax.vmap(sampler.setup.client, (0, 0, None, CLIENT_AXES))
    return setup(each(setup_key(chain_key, b), ids), states, broadcast, clients)


def setup_server(sampler: FederatedSampler, chain_key, server_state, uploads, b: int):
    """The server's side of the setup exchange: ``(server_state, message, info)``."""
    return sampler.setup.server(jax.random.fold_in(setup_key(chain_key, b), b), server_state, uploads)


def setup_receive(sampler: FederatedSampler, states, message):
    return jax.vmap(sampler.setup.receive, (0, None))(states, message)


def participation(sampler: FederatedSampler, chain_key, k, b: int):
    """``[b]`` mask of the clients active in round ``k``, materialised
    (:func:`fedmcmc.core.xla.materialize`): the clients' step, the server's step and the round's
    counts all read it, and XLA otherwise recomputed its uniforms in each of them (8 copies of
    the hash in a QLSD++ round under Bernoulli participation; stored once, that round runs 16%
    faster, FedAvg's 7%, and its chunk compiles about a fifth faster)."""
    return materialize(sampler.participation.sample(jax.random.fold_in(round_key(chain_key, k), b + 1), b))


def client_keys(chain_key, k, ids) -> jax.Array:
    """The keys of clients ``ids`` in round ``k``."""
    return each(round_key(chain_key, k), ids)


def client_round(sampler: FederatedSampler, chain_key, k, states, broadcast, clients, ids, mask) -> tuple[Any, Any, Any]:
    """Clients ``ids`` in round ``k``: ``(states, uploads, infos)``; inactive ones (``mask``
    false) keep their state."""
    step = jax.vmap(sampler.client_step, (0, 0, None, CLIENT_AXES, None))
    new_states, uploads, infos = step(client_keys(chain_key, k, ids), states, broadcast, clients, k)
    return select(mask, new_states, states), uploads, infos


def active_clients_round(sampler: FederatedSampler, chain_key, k, states, broadcast, clients, ids, mask,
                         max_active: int) -> tuple[Any, Any, Any]:
    """:func:`client_round` when at most ``max_active`` clients are active: only they compute, with
    the keys, states and data of the dense path; index ``b`` marks an empty slot, read clamped and
    written nowhere."""
    b = ids.shape[0]
    idx = jnp.nonzero(mask, size=max_active, fill_value=b)[0]
    take = partial(jax.tree_util.tree_map, lambda a: a[jnp.minimum(idx, b - 1)])
    scatter = partial(jax.tree_util.tree_map,
                      lambda u: jnp.zeros((b,) + u.shape[1:], u.dtype).at[idx].set(u, mode="drop"))
    new, sub_up, sub_info = jax.vmap(sampler.client_step, (0, 0, None, CLIENT_AXES, None))(
        take(client_keys(chain_key, k, ids)), take(states), broadcast, clients.take(jnp.minimum(idx, b - 1)), k)
    states = jax.tree_util.tree_map(lambda a, n: a.at[idx].set(n, mode="drop"), states, new)
    return states, scatter(sub_up), scatter(sub_info)


def server_round(sampler: FederatedSampler, chain_key, k, server_state, uploads, mask, b: int):
    """The server in round ``k``: ``(server_state, broadcast, info)``.

    The server sees the uploads as delivered: an optimisation barrier keeps XLA from fusing the
    clients' computation into the server's step in the simulator, which a message runtime cannot
    do either (it changed the last bit of pSGLD's draws between the two); and on CPU, where that
    barrier is gone by the time XLA fuses, a :func:`fedmcmc.core.xla.fusion_barrier` on every
    upload that is an array per client (LSD*'s gradients were otherwise computed inside the
    server's copy of them, 2-4 times slower, and QLSD*'s quantiser drew its random numbers
    twice); a scalar per client costs less to recompute than to barrier."""
    uploads = jax.tree_util.tree_map(lambda u: fusion_barrier(u) if u.ndim > 1 else u,
                                     jax.lax.optimization_barrier(uploads))
    return sampler.server_step(jax.random.fold_in(round_key(chain_key, k), b), server_state, uploads, mask, k)
