"""A block of chains run in one process (:class:`Chains`): the simulator's unit of work, in the
calling process (:mod:`fedmcmc.runtime.simulator`), in a worker process
(:mod:`fedmcmc.runtime.workers`) or split over local devices (:mod:`fedmcmc.runtime.devices`).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from fedmcmc.core.base import FederatedSampler
from fedmcmc.data.federated import FederatedData
from fedmcmc.runtime import devices as placement
from fedmcmc.runtime.programs import build, fitting, inputs, total
from fedmcmc.runtime.round import blockwise

__all__ = ["Chains"]


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
