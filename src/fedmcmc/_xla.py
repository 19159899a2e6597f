"""CPU tuning of JAX and XLA that changes no sampler's law (all measured on 2 cores).

1. JAX lowers the threefry2x32 hash on CPU as a rolled 5-step ``while`` loop (to keep
   compile times short); inside our scans every random draw then runs a loop of tiny
   kernels. We register JAX's own unrolled lowering (the one it uses on GPU): the same
   hash and the same bits, as straight-line code that XLA fuses.
2. XLA's YNNPACK fusions were slower than its own loop fusions for our small batched
   reductions (a round of QLSD* with 30 chains: 1.44 ms with them, 1.10 ms without).
3. One XLA CPU device per core, so that the simulator can spread chains over the cores
   (1.7x with 2 cores).

(2) and (3) are XLA flags, read when JAX starts its CPU backend: they take effect only if
fedmcmc is imported before the first JAX computation. Set ``FEDMCMC_XLA_TUNING=0`` to keep
JAX's defaults; flags already present in ``XLA_FLAGS`` are left as they are.
"""

from __future__ import annotations

import os


def _set_xla_flags() -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    extra = []
    if "xla_cpu_experimental_ynn_fusion_type" not in flags:
        extra.append("--xla_cpu_experimental_ynn_fusion_type=")
    if "xla_force_host_platform_device_count" not in flags:
        extra.append(f"--xla_force_host_platform_device_count={max(1, os.cpu_count() or 1)}")
    if extra:
        os.environ["XLA_FLAGS"] = " ".join([flags, *extra]).strip()


def _unroll_threefry_on_cpu() -> bool:
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as tf

        mlir.register_lowering(tf.threefry2x32_p, tf._threefry2x32_lowering_rule, platform="cpu")
        return True
    except (ImportError, AttributeError):  # pragma: no cover - depends on the JAX version
        return False


def materialize(x):
    """Return the integer array ``x`` unchanged, but computed once by the compiler.

    XLA fuses cheap elementwise producers (threefry hashes, stochastic rounding) into every
    consumer and recomputes them per element there: for a ``[k, k]`` comparison of ``k``
    random draws that is ``k`` times the random numbers. ``max(x, lowest) == x`` written as a
    reduction over a trailing axis of size 2 becomes a fusion root, so ``x`` is stored
    instead. It never changes a value.
    """
    import jax.numpy as jnp

    lowest = jnp.full_like(x, jnp.iinfo(x.dtype).min)
    return jnp.max(jnp.stack([x, lowest], axis=-1), axis=-1)


TUNED = os.environ.get("FEDMCMC_XLA_TUNING", "1") != "0"
if TUNED:
    _set_xla_flags()
THREEFRY_UNROLLED = TUNED and _unroll_threefry_on_cpu()
