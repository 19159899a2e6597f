"""The vectorised runtime: clients under ``vmap``, rounds in ``lax.scan``, chains under ``vmap``.

A round is :mod:`fedmcmc.runtime.round` (which holds the key schedule, the same in every
runtime). A run goes in chunks of a fixed number of rounds (compiled once). After each chunk
the draws are appended to ``out_dir`` and the full state is checkpointed
(:mod:`fedmcmc.runtime.records`), so a run that was killed resumes from its last completed
chunk (``resume=True``) and gives exactly the samples of an uninterrupted run.

Chains run in blocks (:class:`Chains`): one block in this process by default, or one block
per worker process after :func:`fedmcmc.tune_cpu` (:mod:`fedmcmc.runtime.workers`), or split over
local GPUs (:mod:`fedmcmc.runtime.devices`). A block derives its chains' keys from their global
indices, so the split never changes a sample.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.checks import check_schedule
from fedmcmc.core.base import CLIENT_AXES, FederatedSampler
from fedmcmc.data.federated import FederatedData
from fedmcmc.runtime import cpu, devices as placement, round as rnd
from fedmcmc.runtime.records import (SimulationResult, assemble, check_finite, fingerprint,
                                     save_npz)
from fedmcmc.runtime.round import chain_keys

__all__ = ["simulate", "Chains"]

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


def _total(hi, lo) -> np.ndarray:
    return np.asarray(hi, np.int64) * (1 << _LO_BITS) + np.asarray(lo, np.int64)


_BUILT: "OrderedDict[tuple, tuple]" = OrderedDict()


def _build(sampler: FederatedSampler, data: FederatedData, statistic: Callable | None, devices: tuple | None):
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

    def chain_round(chain_key, carry: _Carry, k):
        mask = rnd.participation(sampler, chain_key, k, b)
        if max_active is None:
            client_states, uploads, cinfo = rnd.client_round(sampler, chain_key, k, carry.client_states,
                                                             carry.broadcast, clients, ids, mask)
        else:
            client_states, uploads, cinfo = rnd.active_clients_round(sampler, chain_key, k, carry.client_states,
                                                                     carry.broadcast, clients, ids, mask, max_active)
        server_state, broadcast, sinfo = rnd.server_round(sampler, chain_key, k, carry.server_state, uploads, mask, b)
        n_active = jnp.sum(mask.astype(jnp.int32))
        bits_up = jnp.sum(jnp.where(mask, cinfo.bits, 0).astype(jnp.int32))
        bits_down = n_active * sinfo.broadcast_bits
        return _Carry(server_state, broadcast, client_states), (bits_up, bits_down, n_active)

    rounds = jax.vmap(chain_round, (0, 0, None))

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


class Chains:
    """A block of chains with consecutive global indices, run in this process.

    Holds the compiled programs and the chains' state between chunks. The same object runs
    inside a worker process (:mod:`fedmcmc.runtime.workers`), where :class:`fedmcmc.runtime.workers.Remote`
    forwards these methods to it, or split over ``devices`` (:mod:`fedmcmc.runtime.devices`).
    """

    def __init__(self, sampler: FederatedSampler, data: FederatedData, statistic: Callable | None, seed: int,
                 chains: range, theta0, devices: tuple | None = None):
        self.chains = chains
        self.init, self.chunk = _build(sampler, data, statistic, devices)
        self.width = placement.width(len(chains), devices)
        self.keys = chain_keys(seed, np.arange(chains.start, chains.start + self.width))
        self.theta_shape = tuple(theta0.shape[1:])
        theta0 = jnp.asarray(placement.pad(theta0, self.width), jnp.float32)
        with self._fitting():
            self.carry, (up, down) = self.init(self.keys, theta0)
        n = len(chains)
        self.setup_bits = (np.asarray(up, np.int64)[:n].sum(axis=1), np.asarray(down, np.int64)[:n] * data.num_clients)

    @contextlib.contextmanager
    def _fitting(self):
        """A shape error while the programs are first traced is theta0's: one line that says so.
        (Traced by the calls themselves: a separate ``eval_shape`` would trace them twice.)"""
        try:
            yield
        except (TypeError, ValueError) as err:
            if getattr(self, "fits", False):
                raise
            raise ValueError(f"theta0 of shape {self.theta_shape} does not fit this sampler and data "
                             f"(give one value per model parameter): {str(err).splitlines()[0]}") from None

    def run(self, k0: int, num_draws: int, thinning: int) -> dict:
        """Rounds ``k0 + 1 .. k0 + num_draws * thinning``: positions ``[chains, draws, m, d]``, the
        bit and participation counts of each draw's window, statistics ``[chains, rounds, ...]``."""
        with self._fitting():
            self.carry, positions, windows, stats = self.chunk(self.keys, self.carry, jnp.int32(k0), num_draws,
                                                               thinning)
        self.fits = True
        out = {"positions": np.asarray(positions), "up": _total(windows.up_hi, windows.up_lo),
               "down": _total(windows.down_hi, windows.down_lo), "active": np.asarray(windows.active)}
        if stats is not None:
            s = np.asarray(stats)  # [chains, draws, thinning, ...]
            out["stats"] = s.reshape((s.shape[0], num_draws * thinning) + s.shape[3:])
        return {name: x[:len(self.chains)] for name, x in out.items()}

    def state(self) -> list[np.ndarray]:
        """The chains' full state, as leaves with the chain axis first (for checkpoints)."""
        return [np.asarray(x)[:len(self.chains)] for x in jax.tree_util.tree_leaves(self.carry)]

    def restore(self, leaves) -> None:
        treedef = jax.tree_util.tree_structure(self.carry)
        self.carry = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(placement.pad(x, self.width))
                                                            for x in leaves])

    def submit(self, method: str, *args) -> None:
        """Call ``method(*args)`` now; :meth:`result` returns what it returned (the interface
        of a block in a worker process, which runs while the caller goes on)."""
        self._result = getattr(self, method)(*args)

    def result(self):
        return self._result


def _blocks(num_chains: int, workers: int) -> list[range]:
    """Consecutive chain indices, split as evenly as possible over at most ``workers`` blocks of
    at least 2 chains: XLA compiles a batch of one chain differently (it drops the axis), which
    can change the last bit of a sample, while batches of 2 or more give every chain the same
    numbers (tested)."""
    workers = max(1, min(workers, num_chains // 2))
    edges = np.linspace(0, num_chains, workers + 1).round().astype(int)
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:])]


def _start(seed: int, sampler: FederatedSampler, data: FederatedData, statistic, theta0: np.ndarray,
           workers: int | None, devices: int | None) -> list:
    """The blocks of chains: in this process (on one device or spread over several), or spread
    over worker processes (the :func:`fedmcmc.tune_cpu` default, on CPU only)."""
    spread = placement.placement(devices, theta0.shape[0])
    if spread is not None:
        return [Chains(sampler, data, statistic, seed, range(theta0.shape[0]), theta0, spread)]
    if workers is None:
        workers = cpu.default_workers()
    if jax.default_backend() != "cpu":
        workers = 1
    ranges = _blocks(theta0.shape[0], workers)
    if len(ranges) > 1:
        from fedmcmc.runtime import workers as pool

        return pool.start(seed, sampler, data, statistic, ranges, theta0)
    return [Chains(sampler, data, statistic, seed, ranges[0], theta0)]


def _each(blocks, method: str, args):
    """Call ``method(*args(block))`` on every block; remote blocks run at the same time."""
    for block in blocks:
        block.submit(method, *args(block))
    return [block.result() for block in blocks]


def _kept(out: dict, done: int, length: int, thinning: int, burn_in: int) -> dict:
    """A chunk's record, once its draws are checked finite: what is kept goes to disk, the draws and
    statistics after burn-in and the bit counts always."""
    draw_rounds = done + np.arange(1, length // thinning + 1) * thinning
    positions = out["positions"]  # [chains, draws, m, d]
    check_finite(positions, draw_rounds)
    kept = positions[:, draw_rounds > burn_in]
    piece = {"positions": kept.reshape((kept.shape[0], -1) + kept.shape[3:]),
             "up": out["up"], "down": out["down"], "active": out["active"]}
    if "stats" in out:
        piece["stats"] = out["stats"][:, done + np.arange(1, length + 1) > burn_in]
    return piece


def _checked(sampler, data, theta0, num_iterations, num_chains, burn_in, thinning, chunk_size, out_dir, resume):
    """The run's settings checked (one line naming the problem and the fix): ``theta0`` as
    ``[num_chains, d]`` and the chunk size."""
    chunk_size = check_schedule(num_iterations, num_chains, burn_in, thinning, chunk_size)
    theta0 = jnp.asarray(theta0, jnp.float32)
    if theta0.ndim == 1:
        theta0 = jnp.broadcast_to(theta0, (num_chains,) + theta0.shape)
    if theta0.ndim != 2 or theta0.shape[0] != num_chains:
        raise ValueError(f"theta0 must have shape [d] or [num_chains, d] (got {tuple(theta0.shape)})")
    if sampler.num_clients not in (None, data.num_clients):
        raise ValueError(f"the sampler has per-client settings for {sampler.num_clients} clients but the data "
                         f"has {data.num_clients}; give one value per client")
    if resume and out_dir is None:
        raise ValueError("resume needs out_dir, the folder of the interrupted run")
    return np.asarray(theta0), chunk_size


def _restore(chunk_dir: Path | None, resume: bool, run_fingerprint: str, blocks) -> tuple[int, float, list[dict]]:
    """Rounds done, wall time and chunks of the run in ``chunk_dir``, with the blocks' state restored
    when resuming; otherwise nothing done (old files go with the first chunk, :func:`_save`)."""
    done, wall, pieces = 0, 0.0, []
    if chunk_dir is None:
        return done, wall, pieces
    state_path = chunk_dir / "state.npz"
    if resume and state_path.exists():
        saved = np.load(state_path)
        if str(saved["fingerprint"]) != run_fingerprint:
            raise ValueError(f"cannot resume from {chunk_dir}: it holds a run with different settings; "
                             "use another --out folder or drop --resume")
        leaves = [saved[f"leaf{i}"] for i in range(sum(name.startswith("leaf") for name in saved.files))]
        _each(blocks, "restore", lambda block: ([x[block.chains.start:block.chains.stop] for x in leaves],))
        done, wall = int(saved["done"]), float(saved["wall"])
        for i in range(int(saved["num_chunks"])):
            with np.load(chunk_dir / f"chunk_{i:06d}.npz") as z:
                pieces.append({name: z[name] for name in z.files})
    chunk_dir.mkdir(parents=True, exist_ok=True)
    return done, wall, pieces


def _save(chunk_dir: Path, pieces: list[dict], blocks, run_fingerprint: str, done: int, wall: float, fresh: bool):
    """Write the last chunk and the checkpoint (the blocks' state); a fresh run's first chunk
    first removes the folder's old files, so a run that fails before it leaves them."""
    if fresh and len(pieces) == 1:
        for old in chunk_dir.iterdir():
            old.unlink()
    save_npz(chunk_dir / f"chunk_{len(pieces) - 1:06d}.npz", **pieces[-1])
    leaves = [np.concatenate(x) for x in zip(*_each(blocks, "state", lambda block: ()))]
    save_npz(chunk_dir / "state.npz", fingerprint=np.asarray(run_fingerprint), done=np.asarray(done),
             wall=np.asarray(wall), num_chunks=np.asarray(len(pieces)), **{f"leaf{i}": x for i, x in enumerate(leaves)})


def simulate(seed: int, sampler: FederatedSampler, data: FederatedData, theta0, num_iterations: int, *,
             num_chains: int = 1, burn_in: int = 0, thinning: int = 1, statistic: Callable | None = None,
             chunk_size: int | None = None, out_dir: str | os.PathLike | None = None, resume: bool = False,
             progress: bool = False, description: str | None = None, workers: int | None = None,
             devices: int | None = None) -> SimulationResult:
    """Run ``num_chains`` independent chains of a federated sampler for ``num_iterations`` rounds.

    Parameters
    ----------
    seed
        Integer seed; every random number of the run derives from it (module docstring).
    sampler, data
        The algorithm and the clients' data.
    theta0
        Initial parameter, ``[d]`` (shared by all chains) or ``[num_chains, d]``.
    num_iterations
        Number of rounds; a multiple of ``thinning``.
    burn_in
        Rounds whose draws and statistics are dropped.
    thinning
        Keep the parameter every ``thinning`` rounds (statistics are kept every round).
    statistic
        Optional ``theta -> array``, recorded at every round after burn-in.
    chunk_size
        Rounds per compiled chunk (a multiple of ``thinning``); default about 10,000.
    out_dir
        Where draws and checkpoints are written as the run goes (``out_dir/chunks``).
    resume
        Continue a run killed after its last completed chunk in ``out_dir``.
    progress
        Show a progress bar with the rate in rounds per second.
    workers
        Worker processes to spread the chains over (:mod:`fedmcmc.runtime.workers`); default: the
        number set by :func:`fedmcmc.tune_cpu`, which is 1 (this process) until it is called.
        The samples do not depend on it.
    devices
        Local GPUs or TPUs to spread the chains over (:mod:`fedmcmc.runtime.devices`); default: all
        of them on a GPU or TPU, one on CPU (more is refused). The samples do not depend on it.
    """
    theta0, chunk_size = _checked(sampler, data, theta0, num_iterations, num_chains, burn_in, thinning, chunk_size,
                                  out_dir, resume)
    blocks = _start(seed, sampler, data, statistic, theta0, workers, devices)
    setup_bits = tuple(np.concatenate(parts) for parts in zip(*(block.setup_bits for block in blocks)))
    m = int(sampler.draws_per_round)
    run_fingerprint = fingerprint(seed=seed, sampler=sampler.name, clients=data.num_clients, n=data.total,
                               d=int(theta0.shape[1]), chains=num_chains, iterations=num_iterations,
                               burn_in=burn_in, thinning=thinning, chunk=chunk_size,
                               theta0=hashlib.sha256(theta0.tobytes()).hexdigest())

    chunk_dir = None if out_dir is None else Path(out_dir) / "chunks"
    done, wall, pieces = _restore(chunk_dir, resume, run_fingerprint, blocks)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=num_iterations, initial=done, unit="it", desc=description or sampler.name,
                   dynamic_ncols=True, postfix={"chains": num_chains})

    try:
        while done < num_iterations:
            length = min(chunk_size, num_iterations - done)
            start = time.perf_counter()
            parts = _each(blocks, "run", lambda block: (done, length // thinning, thinning))
            wall += time.perf_counter() - start
            pieces.append(_kept({name: np.concatenate([p[name] for p in parts]) for name in parts[0]},
                                done, length, thinning, burn_in))
            done += length
            if chunk_dir is not None:
                _save(chunk_dir, pieces, blocks, run_fingerprint, done, wall, fresh=not resume)
            if bar is not None:
                bar.update(length)
    finally:
        if bar is not None:
            bar.close()

    return assemble(pieces, num_iterations, burn_in, thinning, statistic is not None, wall, m, setup_bits)
