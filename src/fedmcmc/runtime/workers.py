"""Chains spread over worker processes, one per core (turned on by :func:`fedmcmc.tune_cpu`).

Why processes: XLA's CPU devices of one process share one intra-op thread pool, one thread
per core. jaxlib's LAPACK kernels (``eigh``, ``solve``, ``cholesky``, ...) split a batch over
that pool and block the calling thread until the pieces are done; when every pool thread is
such a caller (two devices' programs each in a LAPACK call, on two cores), nothing is left to
run the pieces and the process waits forever (docs/design.md, "Chains over cores"). A worker
process has one XLA device (``jax_num_cpu_devices``), running one program at a time, so that
wait cannot arise, and each worker is pinned to its own core. It starts XLA with as many
intra-op threads as the parent has, so that it compiles the parent's programs, hence gives the
parent's draws bit for bit: one if the parent started XLA on one thread
(:func:`fedmcmc.runtime.cpu.one_thread_xla`, as fedmcmc's own processes do), else as many as the
parent's cores. It keeps the parent's ``XLA_FLAGS`` as they are: they are part of the key of
JAX's compilation cache, so a worker loads from the cache the programs the parent compiled, and
the parent those of the workers.

The protocol is a strict request and reply over the worker's stdin and stdout: frames of
an 8-byte length and a pickle. A request is ``(method, args)``; the reply is ``("ok", value)``
or ``("error", exception, traceback)``. ``start`` builds a :class:`fedmcmc.runtime.blocks.Chains`
from a job (sampler, data, statistic; sent with cloudpickle once and then named by its
hash) and the block's chains; ``run``, ``state`` and ``restore`` are forwarded to it.
A worker exits when its stdin closes, so it never outlives the process that started it.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import pickle
import shutil
import struct
import subprocess
import sys
import tempfile
import traceback

from fedmcmc.runtime.cpu import available_cores, one_thread_xla, started_one_thread

_JOBS_KEPT = 8
_CONFIG = ("jax_enable_x64", "jax_default_prng_impl", "jax_threefry_partitionable", "jax_default_matmul_precision")


def _write(stream, obj) -> None:
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(payload)))
    stream.write(payload)
    stream.flush()


def _read(stream):
    head = stream.read(8)
    if len(head) < 8:
        raise EOFError
    (size,) = struct.unpack("<Q", head)
    payload = stream.read(size)
    if len(payload) < size:
        raise EOFError
    return pickle.loads(payload)


class WorkerError(RuntimeError):
    """A worker process died or could not run its block."""


class _Process:
    def __init__(self, index: int, core: int | None, cache: dict, one_thread: bool):
        env = {**os.environ, **cache}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        args = [sys.executable, "-m", "fedmcmc.runtime.workers", str(int(one_thread))]
        args += [str(core)] if core is not None else []
        self.index = index
        try:
            self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                         cwd=os.getcwd())
        except OSError as err:  # the pool's other processes end with it (at exit, or the next pool)
            raise WorkerError(f"cannot start worker process {index} ({err})") from None
        self.jobs: dict[str, None] = {}  # the jobs the worker holds, oldest first (as it evicts them)

    def send(self, method: str, *args) -> None:
        try:
            _write(self.proc.stdin, (method, args))
        except (BrokenPipeError, OSError):
            self._died()

    def receive(self):
        try:
            status, *rest = _read(self.proc.stdout)
        except (EOFError, OSError):
            self._died()
        if status == "ok":
            return rest[0]
        error, trace = rest
        if isinstance(error, Exception):
            raise error
        raise WorkerError(f"worker {self.index} failed with {trace.strip().splitlines()[-1]}")

    def _died(self):
        code = self.proc.poll()
        _shutdown()
        raise WorkerError(f"worker process {self.index} exited (code {code}); its error, if any, is printed above")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()


_POOL: list[_Process] = []
_CACHE: list[str] = []  # the pool's own compilation cache folder, if it has one


def _cache_env() -> dict:
    """The workers' shared XLA compilation cache, as environment variables: this process's (its
    ``jax.config``, which ``JAX_COMPILATION_CACHE_DIR`` and the like set too: folder, size bound
    and thresholds), or else a folder of the pool's own, removed with the pool, that keeps every
    program (:func:`start`)."""
    import jax

    if jax.config.jax_compilation_cache_dir:
        names = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
                 "jax_persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_entry_size_bytes")
        return {name.upper(): str(getattr(jax.config, name)) for name in names}
    _CACHE.append(tempfile.mkdtemp(prefix="fedmcmc-workers-xla-"))
    return {"JAX_COMPILATION_CACHE_DIR": _CACHE[-1], "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
            "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def _pool(size: int) -> list[_Process]:
    if len(_POOL) != size or any(p.proc.poll() is not None for p in _POOL):
        _shutdown()
        cores, cache = available_cores(), _cache_env()
        pin = size <= len(cores)
        _POOL.extend(_Process(i, cores[i] if pin else None, cache, started_one_thread()) for i in range(size))
    return _POOL


def _shutdown() -> None:
    while _POOL:
        _POOL.pop().close()
    while _CACHE:
        shutil.rmtree(_CACHE.pop(), ignore_errors=True)


atexit.register(_shutdown)


class Remote:
    """A block of chains that lives in a worker process (the interface of ``Chains``)."""

    def __init__(self, process: _Process, chains: range):
        self.process, self.chains = process, chains
        self.setup_bits = None

    def submit(self, method: str, *args) -> None:
        self.process.send(method, *args)

    def result(self):
        return self.process.receive()


def start(seed: int, sampler, data, statistic, blocks: list[range], theta0, width: int, lengths=()) -> list[Remote]:
    """Start one range of chains per worker (``theta0``: ``[num_chains, d]``), each computed in
    blocks of ``width`` chains (:func:`fedmcmc.runtime.round.block_width`).

    Every worker runs the same programs, of ``width`` chains. The first worker compiles its init
    program and its chunks of ``lengths`` (``(num_draws, thinning)`` pairs,
    :func:`fedmcmc.runtime.programs.compile_block`) before the others start, and they load those
    programs from the workers' shared compilation cache (:func:`_cache_env`): one compilation
    instead of one per worker, in about the same time."""
    import cloudpickle
    import jax

    try:
        job = cloudpickle.dumps((sampler, data, statistic))
    except Exception as err:  # noqa: BLE001 - cloudpickle raises many kinds
        raise ValueError(f"cannot send this sampler to worker processes ({err}); "
                         "run it in this process with workers=1 (fedmcmc.tune_cpu(1))") from None
    name = hashlib.sha256(job).hexdigest()
    config = {key: getattr(jax.config, key) for key in _CONFIG if hasattr(jax.config, key)}
    remotes = [Remote(process, chains) for process, chains in zip(_pool(len(blocks)), blocks)]
    steps = [("compile", remotes[:1], (list(lengths),))] if len(remotes) > 1 else []
    for method, group, extra in steps + [("start", remotes, ())]:
        for r in group:
            r.submit(method, name, None if name in r.process.jobs else job, config, seed, r.chains, width,
                     theta0[r.chains.start:r.chains.stop], *extra)
            r.process.jobs[name] = None
            while len(r.process.jobs) > _JOBS_KEPT:
                r.process.jobs.pop(next(iter(r.process.jobs)))
        for r in group:
            try:
                r.setup_bits = r.result()
            except Exception:
                r.process.jobs.pop(name, None)
                raise
    return remotes


def pin(thread: int, core: int) -> None:
    """Pin thread ``thread`` (a Linux thread id) to ``core``. A thread that has exited since it
    was listed (``ProcessLookupError``) needs no pinning and is passed over."""
    try:
        os.sched_setaffinity(thread, {core})
    except ProcessLookupError:
        pass


def _serve(one_thread: bool, core: int | None) -> None:  # pragma: no cover - runs in the worker process
    requests, replies = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything printed goes to stderr, never into the replies
    import jax

    jax.config.update("jax_num_cpu_devices", 1)  # whatever --xla_force_host_platform_device_count says

    # XLA's CPU client sizes the programs it compiles to its intra-op threads, as many as the
    # cores the process may use when it starts: start it as the parent did (on one thread, or
    # on the parent's cores) and only then pin, so that a worker compiles the parent's programs
    # and its draws are the parent's bit for bit (docs/design.md).
    if one_thread:
        one_thread_xla()
    jax.devices()
    if core is not None and hasattr(os, "sched_setaffinity"):
        for thread in os.listdir("/proc/self/task"):  # the pool's threads too
            pin(int(thread), core)
    # imported only now, after the XLA settings above: importing the samplers may start JAX
    from fedmcmc.runtime.blocks import Chains
    from fedmcmc.runtime.programs import compile_block

    jobs: dict[str, tuple] = {}
    block = None
    while True:
        try:
            method, args = _read(requests)
        except EOFError:
            return
        try:
            if method in ("start", "compile"):
                name, job, config, seed, chains, width, theta0, *lengths = args
                if job is not None:
                    jobs[name] = pickle.loads(job)
                    while len(jobs) > _JOBS_KEPT:
                        jobs.pop(next(iter(jobs)))
                for key, value in config.items():
                    jax.config.update(key, value)
                if method == "compile":
                    value = compile_block(*jobs[name], seed, chains, theta0, width, *lengths)
                else:
                    block = Chains(*jobs[name], seed, chains, theta0, width=width)
                    value = block.setup_bits
            else:
                value = getattr(block, method)(*args)
            _write(replies, ("ok", value))
        except Exception as err:  # noqa: BLE001 - every error goes back to the caller
            trace = traceback.format_exc()
            try:
                pickle.dumps(err)
            except Exception:  # noqa: BLE001
                err = None
            _write(replies, ("error", err, trace))


if __name__ == "__main__":  # pragma: no cover
    try:
        _serve(sys.argv[1] == "1", int(sys.argv[2]) if len(sys.argv) > 2 else None)
    except Exception as err:  # noqa: BLE001 - one line for the parent's message to point to, no traceback
        sys.stderr.write(f"fedmcmc worker process: {type(err).__name__}: {err}\n")
        raise SystemExit(1) from None
