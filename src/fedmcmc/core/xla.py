"""How fedmcmc compiles its programs: :func:`jit`, :func:`materialize` and :func:`fusion_barrier`.

Importing fedmcmc changes nothing in the user's JAX: no ``XLA_FLAGS``, no lowering rule,
no device count. What fedmcmc needs for speed it asks for per program, in :func:`jit`:

1. **XLA's YNNPACK fusions off** (``compiler_options``, this program only). They were slower
   than XLA's own loop fusions for our small batched reductions (a round of QLSD* with 30
   chains: 1.44 ms with them, 1.10 ms without).
2. **Threefry unrolled.** JAX lowers the threefry2x32 hash on CPU as a rolled 5-step
   ``while`` loop; inside our scans every random draw then runs a loop of tiny kernels. While
   one of our programs is lowered, JAX's own unrolled lowering (the one it uses on GPU) is
   put in place, and the previous rule is put back straight after: the same hash, as
   straight-line code that XLA fuses.

3. **Eigen's dot and convolution kernels on the calling thread** (``xla_cpu_multi_thread_eigen``
   false, this program only). Split over XLA's intra-op threads they add in another order, so
   a program gave other last bits in a process with two threads than in a worker process with
   one (a QLSD++ block of 2 chains on breast cancer, 1.5e-8 apart, on an AVX2 CPU). The
   worker processes, one per core, ran so already; the user's process now does too.

All three change how XLA fuses or adds, hence possibly the last bit of a float, so every program
whose numbers must agree (the simulator, its worker processes and the message runtime) is
compiled by this :func:`jit`, and the agreement is tested.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import jax

COMPILER_OPTIONS = {"xla_cpu_experimental_ynn_fusion_type": "", "xla_cpu_multi_thread_eigen": False}
"""XLA options of every fedmcmc program (they apply to that program only)."""

_LOWERING_LOCK = threading.RLock()  # re-entrant: one of our programs may trace another


@contextlib.contextmanager
def _unrolled_threefry():
    """JAX's unrolled threefry lowering on CPU for the programs lowered inside, then the old rule."""
    try:
        from jax._src.interpreters import mlir
        from jax._src.random import threefry2x32 as tf

        rules = mlir._platform_specific_lowerings["cpu"]
        unrolled = mlir.LoweringRuleEntry(tf._threefry2x32_lowering_rule, True)
    except (ImportError, AttributeError, KeyError):  # pragma: no cover - depends on the JAX version
        yield
        return
    with _LOWERING_LOCK:
        missing = object()
        previous = rules.get(tf.threefry2x32_p, missing)
        rules[tf.threefry2x32_p] = unrolled
        try:
            yield
        finally:
            if previous is missing:
                del rules[tf.threefry2x32_p]
            else:
                rules[tf.threefry2x32_p] = previous


def _trace_state_clean() -> bool:
    try:
        from jax._src.core import trace_state_clean
    except ImportError:  # pragma: no cover - depends on the JAX version
        return True
    return trace_state_clean()


def jit(fun, **kwargs):
    """``jax.jit(fun, **kwargs)`` compiled the fedmcmc way (module docstring).

    The returned function compiles on its first call for each argument signature, with the
    YNNPACK option and under the unrolled threefry lowering, and afterwards only calls the
    compiled program; ``.lower(*args).compile()`` compiles for those arguments without running,
    and later calls with them run that program. Called inside another trace (``jax.eval_shape``,
    an outer ``jit``) it is an ordinary nested ``jit``, since XLA options belong to a whole program.
    """
    compiled = jax.jit(fun, compiler_options=COMPILER_OPTIONS, **kwargs)
    inner = jax.jit(fun, **kwargs)  # called inside another trace (eval_shape), where options cannot go

    @functools.wraps(fun)
    def call(*args, **kw):
        if not _trace_state_clean():
            return inner(*args, **kw)
        with _unrolled_threefry():
            return compiled(*args, **kw)

    def lower_call(*args, **kw):
        with _unrolled_threefry():
            return compiled.lower(*args, **kw)

    call.lower = lower_call  # ``call.lower(*args).compile()``: compiled now, and later calls run it
    return call


def lower(fun, *args, **kwargs):
    """``jax.jit(fun, **kwargs).lower(*args)`` the way :func:`jit` compiles (YNNPACK option,
    unrolled threefry): ``.compile()`` gives the program :func:`jit` runs for these argument
    shapes, which can then be kept on disk (:mod:`fedmcmc.runtime.messaging.stored_programs`)."""
    return jit(fun, **kwargs).lower(*args)


def _lowest(dtype):
    """The value ``v`` of ``dtype`` with ``max(v, x) == x`` for every ``x`` (a NaN stays NaN)."""
    import jax.numpy as jnp

    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf
    if dtype == jnp.bool_:
        return False
    return jnp.iinfo(dtype).min


def materialize(x):
    """Return the integer array ``x`` unchanged, but computed once by the compiler.

    XLA fuses cheap elementwise producers (threefry hashes, stochastic rounding) into every
    consumer and recomputes them per element there: for a ``[k, k]`` comparison of ``k``
    random draws that is ``k`` times the random numbers. ``max(x, lowest) == x`` written as a
    reduction over a trailing axis of size 2 becomes a fusion root, so ``x`` is stored
    instead. It never changes a value.
    """
    import jax.numpy as jnp

    lowest = jnp.full_like(x, _lowest(x.dtype))
    return jnp.max(jnp.stack([x, lowest], axis=-1), axis=-1)


def fusion_barrier(x):
    """Return the array ``x`` unchanged, computed into a buffer of its own.

    :func:`materialize` stops XLA from recomputing ``x`` in consumers that read it several
    times, but XLA still fuses ``x`` into a single consumer that reads it once, such as a
    transposing copy: on CPU the reductions of a gradient fused into the copy that lays out
    the clients' uploads for the server's weighted sum ran 2-4 times slower than alone, and
    a quantiser's random draws were computed a second time there. ``lax.optimization_barrier``
    does not prevent it (XLA's CPU pipeline removes it before fusing). A reduce-window is
    never fused on CPU, into a consumer or with a producer, so ``x`` is written once and read
    by the consumers: here the running maximum of ``(lowest, x)`` along a new trailing axis,
    whose last element is ``x`` (``lowest`` as in :func:`materialize`).
    """
    import jax.numpy as jnp

    x = jnp.asarray(x)
    pair = jnp.stack([jnp.full_like(x, _lowest(x.dtype)), x], axis=-1)
    return jax.lax.cummax(pair, axis=x.ndim)[..., 1]
