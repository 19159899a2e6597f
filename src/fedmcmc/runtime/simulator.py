"""The vectorised runtime: clients under ``vmap``, rounds in ``lax.scan``, chains under ``vmap``.

A round is :mod:`fedmcmc.runtime.round` (which holds the key schedule, the same in every
runtime). A run goes in chunks of a fixed number of rounds (compiled once). After each chunk
the draws are appended to ``out_dir`` and the full state is checkpointed
(:mod:`fedmcmc.runtime.records`), so a run that was killed resumes from its last completed
chunk (``resume=True``) and gives exactly the samples of an uninterrupted run. The checkpoint
holds the run's identity (:mod:`fedmcmc.runtime.identity`): a resume of another run is refused,
and so is a new run into a folder whose chunks hold one, unless ``overwrite=True``.

Chains run in blocks of consecutive chains (:class:`fedmcmc.runtime.blocks.Chains`): all of them in this process by
default, or spread over worker processes after :func:`fedmcmc.tune_cpu`
(:mod:`fedmcmc.runtime.workers`), or split over local GPUs (:mod:`fedmcmc.runtime.devices`). A
block derives its chains' keys from their global indices, and on CPU every program computes the
run's fixed blocks of :func:`fedmcmc.runtime.round.block_width` chains wherever it runs, so the
split never changes a sample.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.runtime.settings import check_schedule
from fedmcmc.core.base import FederatedSampler
from fedmcmc.data.federated import FederatedData
from fedmcmc.runtime import cpu, devices as placement, identity, workers as pool
from fedmcmc.runtime.blocks import Chains
from fedmcmc.runtime.round import block_width
from fedmcmc.runtime.records import SimulationResult, assemble, check_finite, save_npz

__all__ = ["simulate"]


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


def _checked(sampler, data, theta0, num_iterations, num_chains, burn_in, thinning, chunk_size, out_dir, resume,
             overwrite):
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
    if resume and overwrite:
        raise ValueError("give resume (continue the run in out_dir) or overwrite (replace it), not both")
    return np.asarray(theta0), chunk_size


def _checkpoint(chunk_dir: Path, resume: bool, overwrite: bool, run_id: dict):
    """The checkpoint to resume from (its arrays by name), or None; refused before any work when it is
    another run's (:func:`fedmcmc.runtime.identity.check_resume`), and a folder whose ``chunks/``
    holds a run is refused unless ``resume`` or ``overwrite`` (:func:`_save` then removes its files)."""
    if not chunk_dir.is_dir():
        return None
    state_path = chunk_dir / "state.npz"
    if resume and state_path.exists():
        with np.load(state_path) as z:
            saved = {name: z[name] for name in z.files}
        identity.check_resume(chunk_dir.parent, saved, run_id)
        return saved
    if not resume and not overwrite and any(chunk_dir.glob("*.npz")):
        raise ValueError(f"{chunk_dir.parent} holds a run (chunks/); continue it with resume=True (--resume), or "
                         "replace it with overwrite=True (--overwrite)")
    return None


def _restore(chunk_dir: Path, saved, blocks) -> tuple[int, float, list[dict]]:
    """Rounds done, wall time and chunks of the checkpoint ``saved`` in ``chunk_dir``, with the blocks'
    state restored; nothing done without one."""
    if saved is None:
        return 0, 0.0, []
    leaves = [saved[f"leaf{i}"] for i in range(sum(name.startswith("leaf") for name in saved))]
    _each(blocks, "restore", lambda block: ([x[block.chains.start:block.chains.stop] for x in leaves],))
    pieces = []
    for i in range(int(saved["num_chunks"])):
        with np.load(chunk_dir / f"chunk_{i:06d}.npz") as z:
            pieces.append({name: z[name] for name in z.files})
    return int(saved["done"]), float(saved["wall"]), pieces


def _save(chunk_dir: Path, pieces: list[dict], blocks, run_id: dict, done: int, wall: float, fresh: bool):
    """Write the last chunk and the checkpoint (the blocks' state and the run's identity); a fresh
    run's first chunk first removes the folder's old files, so a run that fails before it leaves them."""
    if fresh and len(pieces) == 1:
        for old in chunk_dir.iterdir():
            old.unlink()
    save_npz(chunk_dir / f"chunk_{len(pieces) - 1:06d}.npz", **pieces[-1])
    leaves = [np.concatenate(x) for x in zip(*_each(blocks, "state", lambda block: ()))]
    save_npz(chunk_dir / "state.npz", identity=identity.dumps(run_id), done=np.asarray(done),
             wall=np.asarray(wall), num_chunks=np.asarray(len(pieces)), **{f"leaf{i}": x for i, x in enumerate(leaves)})


def simulate(seed: int, sampler: FederatedSampler, data: FederatedData, theta0, num_iterations: int, *,
             num_chains: int = 1, burn_in: int = 0, thinning: int = 1, statistic: Callable | None = None,
             chunk_size: int | None = None, out_dir: str | os.PathLike | None = None, resume: bool = False,
             overwrite: bool = False, settings: Mapping | None = None, progress: bool = False,
             description: str | None = None, workers: int | None = None,
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
        when they can be (:func:`fedmcmc.runtime.settings.default_chunk`).
    out_dir
        Where draws and checkpoints are written as the run goes (``out_dir/chunks``). A folder whose
        ``chunks/`` holds a run is refused (ValueError) unless ``resume`` or ``overwrite``.
    resume
        Continue a run killed after its last completed chunk in ``out_dir``; refused, naming the
        first part that differs, when that run is not this one (:mod:`fedmcmc.runtime.identity`:
        ``settings``, the seed, counts and schedule, each client's data, ``theta0``, the sampler's
        settings and model, ``statistic``).
    overwrite
        Replace the run in ``out_dir``: its chunks are removed as the first chunk of this run is written.
    settings
        What the caller built the run from (a parsed config), part of the run's identity and named
        first when a resume is refused.
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
                                  out_dir, resume, overwrite)
    chunk_dir, run_id, saved = None, None, None
    if out_dir is not None:  # what the checkpoint records of the run, and the one it resumes
        chunk_dir = Path(out_dir) / "chunks"
        run_id = identity.identity(settings, seed=seed, num_chains=num_chains, num_iterations=num_iterations,
                                   burn_in=burn_in, thinning=thinning, chunk_size=chunk_size, theta0=theta0,
                                   data=identity.data_hash(data), sampler=sampler, statistic=statistic)
        saved = _checkpoint(chunk_dir, resume, overwrite, run_id)
    lengths = sorted({(min(chunk_size, num_iterations - done) // thinning, thinning)
                      for done in range(0, num_iterations, chunk_size)})
    blocks = _start(seed, sampler, data, statistic, theta0, workers, devices, lengths)
    setup_bits = tuple(np.concatenate(parts) for parts in zip(*(block.setup_bits for block in blocks)))
    m = int(sampler.draws_per_round)
    done, wall, pieces = _restore(chunk_dir, saved, blocks)
    if chunk_dir is not None:
        chunk_dir.mkdir(parents=True, exist_ok=True)
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
                _save(chunk_dir, pieces, blocks, run_id, done, wall, fresh=not resume)
            if bar is not None:
                bar.update(length)
    finally:
        if bar is not None:
            bar.close()

    return assemble(pieces, num_iterations, burn_in, thinning, statistic is not None, wall, m, setup_bits)
