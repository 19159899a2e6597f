"""The vectorised runtime: clients under ``vmap``, rounds in ``lax.scan``, chains under ``vmap``.

A round is :mod:`fedmcmc.runtime.round` (which holds the key schedule, the same in every
runtime). A run goes in chunks of a fixed number of rounds (compiled once). After each chunk
the draws are appended to ``out_dir`` and the full state is checkpointed
(:mod:`fedmcmc.runtime.records`), so a run that was killed resumes from its last completed
chunk (``resume=True``) and gives exactly the samples of an uninterrupted run.

Chains run in blocks of consecutive chains (:class:`Chains`): all of them in this process by
default, or spread over worker processes after :func:`fedmcmc.tune_cpu`
(:mod:`fedmcmc.runtime.workers`), or split over local GPUs (:mod:`fedmcmc.runtime.devices`). A
block derives its chains' keys from their global indices, and on CPU every program computes the
run's fixed blocks of :func:`fedmcmc.runtime.round.block_width` chains wherever it runs, so the
split never changes a sample.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.checks import check_schedule
from fedmcmc.core.base import FederatedSampler
from fedmcmc.data.federated import FederatedData
from fedmcmc.runtime import cpu, devices as placement
from fedmcmc.runtime.programs import build, fitting, inputs, total
from fedmcmc.runtime.round import block_width, blockwise
from fedmcmc.runtime.records import (SimulationResult, assemble, check_finite, fingerprint,
                                     save_npz)

__all__ = ["simulate", "Chains"]


class Chains:
    """A block of chains with consecutive global indices, run in this process.

    Holds the compiled programs and the chains' state between chunks. The same object runs
    inside a worker process (:mod:`fedmcmc.runtime.workers`), where :class:`fedmcmc.runtime.workers.Remote`
    forwards these methods to it, or split over ``devices`` (:mod:`fedmcmc.runtime.devices`).
    """

    def __init__(self, sampler: FederatedSampler, data: FederatedData, statistic: Callable | None, seed: int,
                 chains: range, theta0, devices: tuple | None = None, width: int | None = None):
        self.chains = chains
        init, chunk = build(sampler, data, statistic, devices)
        # programs of `width` chains: the run's blocks (round.block_width), computed one after the
        # other; or one program of all chains padded to a multiple of the devices, held padded
        self.width = placement.width(len(chains), devices) if devices is not None else width or len(chains)
        self.init, self.chunk = blockwise(init, self.width, 2), blockwise(chunk, self.width, 2)
        self.held = len(chains) if devices is None else self.width
        self.keys, theta0 = inputs(seed, chains, theta0, self.held)
        self.theta_shape = tuple(theta0.shape[1:])
        with self._fitting():
            self.carry, (up, down) = self.init(self.keys, theta0)
        n = len(chains)
        if sampler.setup is not None and sampler.setup.check is not None:
            sampler.setup.check(jax.tree_util.tree_map(lambda a: np.asarray(a)[:n], self.carry.client_states))
        self.setup_bits = (np.asarray(up, np.int64)[:n].sum(axis=1), np.asarray(down, np.int64)[:n] * data.num_clients)

    def _fitting(self):
        return fitting(self.theta_shape, first=not getattr(self, "fits", False))

    def run(self, k0: int, num_draws: int, thinning: int) -> dict:
        """Rounds ``k0 + 1 .. k0 + num_draws * thinning``: positions ``[chains, draws, m, d]``, the
        bit and participation counts of each draw's window, statistics ``[chains, rounds, ...]``."""
        with self._fitting():
            self.carry, positions, windows, stats = self.chunk(self.keys, self.carry, jnp.int32(k0), num_draws,
                                                               thinning)
        self.fits = True
        out = {"positions": np.asarray(positions), "up": total(windows.up_hi, windows.up_lo),
               "down": total(windows.down_hi, windows.down_lo), "active": np.asarray(windows.active)}
        if stats is not None:
            s = np.asarray(stats)  # [chains, draws, thinning, ...]
            out["stats"] = s.reshape((s.shape[0], num_draws * thinning) + s.shape[3:])
        return {name: x[:len(self.chains)] for name, x in out.items()}

    def state(self) -> list[np.ndarray]:
        """The chains' full state, as leaves with the chain axis first (for checkpoints)."""
        return [np.asarray(x)[:len(self.chains)] for x in jax.tree_util.tree_leaves(self.carry)]

    def restore(self, leaves) -> None:
        treedef = jax.tree_util.tree_structure(self.carry)
        self.carry = jax.tree_util.tree_unflatten(treedef, [jnp.asarray(placement.pad(x, self.held))
                                                            for x in leaves])

    def submit(self, method: str, *args) -> None:
        """Call ``method(*args)`` now; :meth:`result` returns what it returned (the interface
        of a block in a worker process, which runs while the caller goes on)."""
        self._result = getattr(self, method)(*args)

    def result(self):
        return self._result


def _blocks(num_chains: int, workers: int, width: int) -> list[range]:
    """Consecutive chain indices for at most ``workers`` processes, each a run of whole blocks of
    ``width`` chains (:func:`fedmcmc.runtime.round.block_width`), spread as evenly as possible."""
    blocks = -(-num_chains // width)
    edges = np.minimum(np.linspace(0, blocks, max(1, min(workers, blocks)) + 1).round().astype(int) * width,
                       num_chains)
    return [range(a, b) for a, b in zip(edges[:-1], edges[1:])]


def _start(seed: int, sampler: FederatedSampler, data: FederatedData, statistic, theta0: np.ndarray,
           workers: int | None, devices: int | None, lengths: list[tuple[int, int]]) -> list:
    """The blocks of chains: in this process (on one device or spread over several), or spread
    over worker processes (the :func:`fedmcmc.tune_cpu` default, on CPU only), which compile the
    chunks of ``lengths`` (``(num_draws, thinning)`` pairs) once per block shape."""
    spread = placement.placement(devices, theta0.shape[0])
    if spread is not None:
        return [Chains(sampler, data, statistic, seed, range(theta0.shape[0]), theta0, spread)]
    if workers is None:
        workers = cpu.default_workers()
    num_chains = theta0.shape[0]
    if jax.default_backend() != "cpu":  # one program of every chain on a GPU or TPU
        return [Chains(sampler, data, statistic, seed, range(num_chains), theta0)]
    width = block_width(num_chains)
    ranges = _blocks(num_chains, workers, width)
    if len(ranges) > 1:
        from fedmcmc.runtime import workers as pool

        return pool.start(seed, sampler, data, statistic, ranges, theta0, width, lengths)
    return [Chains(sampler, data, statistic, seed, ranges[0], theta0, width=width)]


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
        Rounds per compiled chunk (a multiple of ``thinning``); default: at most 10,000, equal chunks
        when they can be (:func:`fedmcmc.core.checks.default_chunk`).
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
    lengths = sorted({(min(chunk_size, num_iterations - done) // thinning, thinning)
                      for done in range(0, num_iterations, chunk_size)})
    blocks = _start(seed, sampler, data, statistic, theta0, workers, devices, lengths)
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
