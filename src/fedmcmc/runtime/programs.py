"""The simulator's two compiled programs: a block of chains' init, and a chunk of rounds.

A round is :mod:`fedmcmc.runtime.round` (clients under ``vmap``, then the server) put under
``vmap`` over chains with the round counter unbatched; a chunk runs it in ``lax.scan`` over
draws and, inside, over the rounds between two kept draws, accumulating the bits sent and the
active clients of each draw's window. Both programs are compiled by
:func:`fedmcmc.core.xla.jit` (:func:`build`, cached per sampler and data) and run by
:class:`fedmcmc.runtime.blocks.Chains`, in this process or in worker processes, which
compile them once per block shape (:func:`compile_block`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import FederatedSampler
from fedmcmc.data.federated import FederatedData
from fedmcmc.runtime import devices as placement, round as rnd
from fedmcmc.runtime.round import chain_keys

_LO_BITS = 20  # bit counters are kept as (hi, lo) int32 pairs: exact up to 2**51


class _Carry(NamedTuple):
    server_state: Any
    broadcast: Any
    client_states: Any


class _Window(NamedTuple):
    up_hi: Any
    up_lo: Any
    down_hi: Any
    down_lo: Any
    active: Any


def _acc(hi, lo, x):
    lo = lo + x
    return hi + (lo >> _LO_BITS), lo & ((1 << _LO_BITS) - 1)


def total(hi, lo) -> np.ndarray:
    return np.asarray(hi, np.int64) * (1 << _LO_BITS) + np.asarray(lo, np.int64)


_BUILT: "OrderedDict[tuple, tuple]" = OrderedDict()


def build(sampler: FederatedSampler, data: FederatedData, statistic: Callable | None, devices: tuple | None):
    """Compiled init and chunk functions (chains spread over ``devices`` if given), cached so repeated
    runs of the same sampler on the same data (chunks, resumes, benchmarks) do not compile again."""
    key = (sampler, id(data.x), id(data.counts), data.groups, statistic, devices)
    if key in _BUILT:
        _BUILT.move_to_end(key)
        return _BUILT[key][1]
    built = placement.programs(*_compile(sampler, data, statistic), devices)
    _BUILT[key] = (data, built)  # holding data keeps the ids valid
    if len(_BUILT) > 16:
        _BUILT.popitem(last=False)
    return built


def _compile(sampler: FederatedSampler, data: FederatedData, statistic: Callable | None):
    clients = jax.tree_util.tree_map(jnp.asarray, data.clients())
    b = data.num_clients
    ids = jnp.arange(b, dtype=jnp.uint32)
    max_active = sampler.participation.max_active
    if max_active is not None and not 1 <= max_active < b:
        max_active = None  # nothing to save

    def chain_init(chain_key, theta0):
        server_state, broadcast = rnd.server_init(sampler, chain_key, theta0, b)
        client_states = rnd.client_init(sampler, chain_key, broadcast, clients, ids)
        setup_up, setup_down = jnp.zeros((b,), jnp.int32), jnp.zeros((), jnp.int32)
        if sampler.setup is not None:
            client_states, uploads, cinfo = rnd.setup_clients(sampler, chain_key, client_states, broadcast, clients,
                                                              ids, b)
            server_state, message, sinfo = rnd.setup_server(sampler, chain_key, server_state, uploads, b)
            client_states = rnd.setup_receive(sampler, client_states, message)
            setup_up, setup_down = cinfo.bits.astype(jnp.int32), jnp.asarray(sinfo.broadcast_bits, jnp.int32)
        return _Carry(server_state, broadcast, client_states), (setup_up, setup_down)

    def chain_clients(chain_key, carry: _Carry, k):
        mask = rnd.participation(sampler, chain_key, k, b)
        if max_active is None:
            client_states, uploads, cinfo = rnd.client_round(sampler, chain_key, k, carry.client_states,
                                                             carry.broadcast, clients, ids, mask)
        else:
            client_states, uploads, cinfo = rnd.active_clients_round(sampler, chain_key, k, carry.client_states,
                                                                     carry.broadcast, clients, ids, mask, max_active)
        return client_states, uploads, cinfo, mask

    def chain_server(chain_key, carry: _Carry, k, client_states, uploads, cinfo, mask):
        server_state, broadcast, sinfo = rnd.server_round(sampler, chain_key, k, carry.server_state, uploads, mask, b)
        n_active = jnp.sum(mask.astype(jnp.int32))
        bits_up = jnp.sum(jnp.where(mask, cinfo.bits, 0).astype(jnp.int32))
        bits_down = n_active * sinfo.broadcast_bits
        return _Carry(server_state, broadcast, client_states), (bits_up, bits_down, n_active)

    def rounds(chain_keys, carry, k):
        # the uploads leave the clients client-major, [b, chains, ...]: the server's weighted sum
        # over clients (a dot) reads them as they are, where chain-major uploads took a transposing
        # copy (8% of a full-batch toy round; same values, same bits)
        client_states, uploads, cinfo, mask = jax.vmap(chain_clients, (0, 0, None), (0, 1, 0, 0))(chain_keys, carry, k)
        return jax.vmap(chain_server, (0, 0, None, 0, 1, 0, 0))(chain_keys, carry, k, client_states, uploads, cinfo, mask)

    def run_chunk(chain_keys, carry, k0, num_draws: int, thinning: int):
        num_chains = chain_keys.shape[0]

        def draw(carry, j):
            def one(state, t):
                carry, w = state
                k = k0 + j * thinning + t
                carry, (up, down, act) = rounds(chain_keys, carry, k)
                up_hi, up_lo = _acc(w.up_hi, w.up_lo, up)
                down_hi, down_lo = _acc(w.down_hi, w.down_lo, down)
                stat = statistic_values(carry)
                return (carry, _Window(up_hi, up_lo, down_hi, down_lo, w.active + act)), stat

            zeros = jnp.zeros((num_chains,), jnp.int32)
            (carry, w), stats = jax.lax.scan(one, (carry, _Window(zeros, zeros, zeros, zeros, zeros)),
                                             jnp.arange(thinning))
            return carry, (recorded(carry.server_state), w, stats)

        carry, (positions, windows, stats) = jax.lax.scan(draw, carry, jnp.arange(num_draws))
        # chains first everywhere, so that every output can be split by chain
        chains_first = jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1), (positions, windows))
        if stats is not None:
            stats = jnp.moveaxis(stats, 2, 0)  # [chains, draws, thinning, ...]
        return carry, *chains_first, stats

    def recorded(server_state):  # [chains, m, d]: the draws of the round
        if sampler.draws_per_round > 1:
            return server_state.draws
        return server_state.position[:, None]

    def statistic_values(carry):
        if statistic is None:
            return None
        return jax.vmap(statistic)(carry.server_state.position)

    return jax.vmap(chain_init), run_chunk


@contextlib.contextmanager
def fitting(theta_shape: tuple, first: bool = True):
    """A shape error while the programs are ``first`` traced is theta0's: one line that says so.
    (Traced by the calls themselves: a separate ``eval_shape`` would trace them twice.)"""
    try:
        yield
    except (TypeError, ValueError) as err:
        if not first:
            raise
        raise ValueError(f"theta0 of shape {theta_shape} does not fit this sampler and data "
                         f"(give one value per model parameter): {str(err).splitlines()[0]}") from None


def inputs(seed: int, chains: range, theta0, width: int):
    """The init program's arguments: the chains' keys and their ``theta0``, padded to ``width`` chains."""
    keys = chain_keys(seed, np.arange(chains.start, chains.start + width))
    return keys, jnp.asarray(placement.pad(theta0, width), jnp.float32)


def compile_block(sampler: FederatedSampler, data: FederatedData, statistic: Callable | None, seed: int,
                  chains: range, theta0, width: int, lengths) -> None:
    """Compile, without running them, the programs that :class:`Chains` of these chains runs: init,
    and the chunk of ``(num_draws, thinning)`` for each pair of ``lengths``. A worker process does
    this before the others start blocks of the same shape, which then load the programs from JAX's
    compilation cache instead of compiling them too (:mod:`fedmcmc.runtime.workers`)."""
    init, chunk = build(sampler, data, statistic, None)
    keys, theta0 = inputs(seed, chains, theta0[:width], width)
    with fitting(tuple(theta0.shape[1:])):
        lowered = init.lower(keys, theta0)
        lowered.compile()
        for num_draws, thinning in lengths:
            chunk.lower(keys, lowered.out_info[0], jnp.int32(0), num_draws, thinning).compile()
