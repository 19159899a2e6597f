"""Chains spread over the local accelerators of this process (GPUs, TPUs) with ``shard_map``.

On a GPU or TPU, :func:`fedmcmc.simulate` splits its chains over every local device of JAX's
default backend (or over ``devices=`` of them): each device runs the program of a block of
consecutive chains, the same program a block runs alone (:class:`fedmcmc.runtime.blocks.Chains`),
with no collective, so the samples are those of one device bit for bit (chains are independent and
their keys depend on their global index only). Clients are not split: the server's sum over
clients would become a reduction across devices, in another order.

On CPU the chains go to worker processes instead (:mod:`fedmcmc.runtime.workers`), and more than
one XLA CPU device is refused: the devices of one process share XLA's intra-op thread pool, where
jaxlib's LAPACK kernels of two concurrent programs can wait on each other forever (docs/design.md,
"Chains over cores"). :func:`programs` itself runs on CPU devices, which is how it is tested.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from fedmcmc.core import xla

__all__ = ["facts", "placement", "programs", "width", "pad"]

_AXIS = "chains"


def facts() -> dict:
    """JAX's default backend here: ``platform``, ``device_kind`` and ``count`` (local devices)."""
    local = jax.local_devices()
    return {"platform": jax.default_backend(), "device_kind": local[0].device_kind, "count": len(local)}


def placement(devices: int | None, num_chains: int) -> tuple | None:
    """The devices to spread ``num_chains`` chains over, or ``None`` for one device.

    Parameters
    ----------
    devices
        Number of local devices to use; ``None``: all of them on a GPU or TPU, one on CPU.
    num_chains
        Chains of the run; every device gets at least two (XLA compiles a batch of one chain
        differently, which can change the last bit of a sample), so fewer devices may be used.

    Raises
    ------
    ValueError
        ``devices`` is not a positive integer, exceeds the local devices, or asks for more
        than one CPU device.
    """
    local = jax.local_devices()
    platform = jax.default_backend()
    if devices is None:
        devices = 1 if platform == "cpu" else len(local)
    if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) or devices < 1:
        raise ValueError(f"devices must be a positive integer, or unset for every local GPU/TPU (got {devices!r})")
    if devices > 1 and platform == "cpu":
        raise ValueError(f"devices={devices} on CPU: chains over XLA CPU devices of one process can deadlock "
                         f"(docs/design.md, 'Chains over cores'); use workers={devices} (worker processes) instead")
    if devices > len(local):
        raise ValueError(f"devices={devices} but JAX has {len(local)} {platform} device(s) here; "
                         f"give at most {len(local)}")
    count = min(int(devices), num_chains // 2)
    return tuple(local[:count]) if count > 1 else None


def width(num_chains: int, devices: tuple | None) -> int:
    """Chains actually run: ``num_chains`` rounded up to a multiple of the device count (the
    extra chains are computed and dropped)."""
    if devices is None:
        return num_chains
    return -(-num_chains // len(devices)) * len(devices)


def pad(x: np.ndarray, total: int) -> np.ndarray:
    """``x`` with its last row along axis 0 repeated up to ``total`` rows (for the extra chains)."""
    x = np.asarray(x)
    return np.concatenate([x, np.repeat(x[-1:], total - x.shape[0], axis=0)]) if total > x.shape[0] else x


def programs(init, run_chunk, devices: tuple | None):
    """The simulator's init and chunk programs (chains first in every input and output but the
    round counter), compiled by :func:`fedmcmc.core.xla.jit`, with their chains split over
    ``devices`` unless it is ``None``."""
    if devices is None:
        return xla.jit(init), xla.jit(run_chunk, static_argnums=(3, 4))
    mesh = Mesh(np.asarray(devices), (_AXIS,))
    chains, same = PartitionSpec(_AXIS), PartitionSpec()
    sharded_init = jax.shard_map(init, mesh=mesh, in_specs=(chains, chains), out_specs=chains, check_vma=False)

    def chunk(keys, carry, k0, num_draws: int, thinning: int):
        def block(keys, carry, k0):
            return run_chunk(keys, carry, k0, num_draws, thinning)

        return jax.shard_map(block, mesh=mesh, in_specs=(chains, chains, same), out_specs=chains,
                             check_vma=False)(keys, carry, k0)

    return xla.jit(sharded_init), xla.jit(chunk, static_argnums=(3, 4))
