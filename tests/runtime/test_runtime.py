"""The runtime never hangs, leaves the user's JAX alone, and gives the same samples wherever
the chains run (this process or worker processes)."""

import json
import os
import subprocess
import sys
import time

import jax.numpy as jnp
import numpy as np
import pytest

import fedmcmc
from catalog import breast_cancer, samplers
from fedmcmc.runtime import simulator, workers
from fedmcmc.runtime.round import block_width, blockwise


@pytest.mark.slow
def test_import_changes_nothing_in_jax():
    code = ("import os, jax; from jax._src.interpreters import mlir; from jax._src.random import threefry2x32 as tf\n"
            "rule = mlir._platform_specific_lowerings['cpu'].get(tf.threefry2x32_p)\n"
            "flags = os.environ.get('XLA_FLAGS'); import fedmcmc, numpy as np\n"
            "from fedmcmc.data.synthetic import heterogeneous_gaussian\n"
            "from fedmcmc.models.gaussian import gaussian_mean\nfrom fedmcmc.samplers import qlsd_sharp\n"
            "d = heterogeneous_gaussian(num_clients=3, dim=2)\n"
            "fedmcmc.simulate(0, qlsd_sharp(gaussian_mean(2), 1e-3, 2), d, np.zeros(2), 3, num_chains=2)\n"
            "assert os.environ.get('XLA_FLAGS') == flags, os.environ.get('XLA_FLAGS')\n"
            "assert mlir._platform_specific_lowerings['cpu'].get(tf.threefry2x32_p) is rule\n"
            "print(len(jax.devices()))")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1"]
    bare = subprocess.run([sys.executable, "-c", "import jax; print(len(jax.devices()))"], capture_output=True,
                          text=True, env=env)
    assert out.stdout == bare.stdout


SPREAD = """
import jax, jax.numpy as jnp, numpy as np, fedmcmc
from fedmcmc.data.synthetic import heterogeneous_gaussian
from fedmcmc.models.gaussian import gaussian_mean
from fedmcmc.samplers import qlsd_sharp
from fedmcmc.compression import quantization
from fedmcmc.runtime import devices
from fedmcmc.runtime.blocks import Chains
data = heterogeneous_gaussian(num_clients=3, dim=2)
sampler = qlsd_sharp(gaussian_mean(2), 1e-3, 2, quantization(4))
assert devices.placement(None, 4) is None  # CPU: one device unless asked, and asking is refused
try:
    fedmcmc.simulate(0, sampler, data, np.zeros(2), 2, num_chains=4, devices=2)
except ValueError as err:
    print(err)
theta0 = np.random.default_rng(0).normal(size=(5, 2)).astype(np.float32)
one = Chains(sampler, data, jnp.linalg.norm, 3, range(5), theta0)
two = Chains(sampler, data, jnp.linalg.norm, 3, range(5), theta0, tuple(jax.devices()))  # 3 + 3 chains, 1 dropped
assert two.width == 6 and len(two.carry.server_state.position.sharding.device_set) == 2
same = [all(np.array_equal(a[k], b[k]) for k in a) for a, b in [(one.run(0, 3, 2), two.run(0, 3, 2))]]
same += [np.array_equal(x, y) for x, y in zip(one.state(), two.state())]
two.restore(one.state())  # a checkpoint of either runs on the other
same += [all(np.array_equal(a[k], b[k]) for k in a) for a, b in [(one.run(6, 3, 2), two.run(6, 3, 2))]]
print("identical", all(same), np.array_equal(one.setup_bits, two.setup_bits))
from fedmcmc.app.bench import accelerator as bench  # on CPU: the device facts only
print(sorted(bench.measure(sampler, data, 2).items())[:3])
"""


@pytest.mark.slow
def test_chains_spread_over_devices_give_the_samples_of_one_device():
    """The accelerator path (chains over devices with shard_map), run on two XLA CPU devices in a
    subprocess: bit for bit the draws, bit counts, statistics and state of one device, with an
    uneven split, across a restore; and refused on CPU through ``simulate`` (docs/design.md)."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    out = subprocess.run([sys.executable, "-c", SPREAD], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    refusal, result, facts = out.stdout.strip().splitlines()
    assert refusal.startswith("devices=2 on CPU") and "use workers=2" in refusal
    assert result == "identical True True"
    assert facts == "[('count', 2), ('device_kind', 'cpu'), ('platform', 'cpu')]"


@pytest.fixture(scope="module")
def problem():
    data, model = breast_cancer()
    return data, model, samplers(data, model)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["qlsd++", "fa-hmc", "cg-dsgld-laplace-full"])
def test_worker_processes_give_the_samples_of_one_process(problem, name):
    data, model, catalog = problem
    sampler, d = catalog[name]
    kwargs = dict(num_chains=5, burn_in=2, thinning=2, statistic=jnp.linalg.norm)  # blocks of 3, the last padded
    here = fedmcmc.simulate(5, sampler, d, np.zeros(model.dim), 8, workers=1, **kwargs)
    spread = fedmcmc.simulate(5, sampler, d, np.zeros(model.dim), 8, workers=2, **kwargs)
    for field in ("samples", "bits_up", "bits_down", "active", "statistics", "total_bits_up", "setup_bits_up"):
        np.testing.assert_array_equal(getattr(spread, field), getattr(here, field), err_msg=field)


CACHED = """
import json, os, numpy as np, fedmcmc
from fedmcmc.runtime.cpu import one_thread_xla
one_thread_xla()
from catalog import breast_cancer, samplers
data, model = breast_cancer()
sampler, d = samplers(data, model)["dsgld"]
folder = os.environ["JAX_COMPILATION_CACHE_DIR"]
kwargs = dict(num_chains=4, burn_in=2, thinning=2)  # two blocks of 2 chains
here = fedmcmc.simulate(3, sampler, d, np.zeros(model.dim), 4, workers=1, **kwargs)
before = set(os.listdir(folder))
spread = fedmcmc.simulate(3, sampler, d, np.zeros(model.dim), 4, workers=2, **kwargs)
added = [name for name in set(os.listdir(folder)) - before if name.startswith(("jit_chain_init", "jit_run_chunk"))]
print(json.dumps({"cached_chunks": sum(name.startswith("jit_run_chunk") for name in before), "added": added,
                  "same": bool(np.array_equal(here.samples, spread.samples))}))
"""


@pytest.mark.slow
def test_workers_load_the_programs_their_parent_compiled(tmp_path):
    """With a compilation cache folder, worker processes load the simulator's programs that the
    process that started them compiled (init and chunk, for the same blocks of chains): they keep
    its ``XLA_FLAGS``, which are part of the cache's key (they used to add flags of their own, and
    compiled every program again)."""
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0", "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, "-c", CACHED], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["cached_chunks"] > 0 and found["added"] == [] and found["same"], found


@pytest.mark.slow
def test_a_run_resumes_with_another_number_of_workers(problem, tmp_path, monkeypatch):
    data, model, catalog = problem
    sampler, d = catalog["qlsd++"]
    kwargs = dict(num_chains=4, burn_in=4, thinning=2, chunk_size=4)  # 2 blocks of 2 chains
    full = fedmcmc.simulate(7, sampler, d, np.zeros(model.dim), 16, **kwargs)
    real_save, calls = simulator.save_npz, {"n": 0}

    def crashing_save(path, **arrays):
        real_save(path, **arrays)
        calls["n"] += 1
        if calls["n"] == 3:  # chunk 0, its state, chunk 1 written: die before the state
            raise KeyboardInterrupt

    monkeypatch.setattr(simulator, "save_npz", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        fedmcmc.simulate(7, sampler, d, np.zeros(model.dim), 16, out_dir=tmp_path, workers=2, **kwargs)
    monkeypatch.setattr(simulator, "save_npz", real_save)
    resumed = fedmcmc.simulate(7, sampler, d, np.zeros(model.dim), 16, out_dir=tmp_path, resume=True, **kwargs)
    np.testing.assert_array_equal(resumed.samples, full.samples)
    np.testing.assert_array_equal(resumed.total_bits_up, full.total_bits_up)


@pytest.mark.slow
def test_worker_errors_reach_the_caller(problem):
    data, model, catalog = problem
    sampler, d = catalog["qlsd*"]
    with pytest.raises(ValueError, match="theta0 of shape"):
        fedmcmc.simulate(0, sampler, d, np.zeros(model.dim + 1), 4, num_chains=4, workers=2)
    workers._POOL[0].proc.kill()  # a worker that died is reported, and the next run starts new ones
    time.sleep(0.5)
    with pytest.raises(workers.WorkerError, match="exited"):
        for w in workers._POOL:
            w.send("state")
            w.receive()
    res = fedmcmc.simulate(0, sampler, d, np.zeros(model.dim), 4, num_chains=4, workers=2)
    assert res.samples.shape == (4, 4, model.dim)


def test_pinning_passes_over_a_thread_that_has_exited():
    """A worker pins the threads listed in /proc/self/task; one that exits before its turn is
    gone, and pinning it is no error. A live thread is pinned."""
    import threading

    cores = os.sched_getaffinity(0)
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()
    workers.pin(thread.native_id, min(cores))
    helper = threading.Thread(target=lambda: (workers.pin(threading.get_native_id(), min(cores)),
                                              pinned.append(os.sched_getaffinity(0))))
    pinned = []
    helper.start()
    helper.join()
    assert pinned == [{min(cores)}] and os.sched_getaffinity(0) == cores


SHARED = """
import os
import numpy as np, fedmcmc
from fedmcmc.compression import quantization
from fedmcmc.data.synthetic import heterogeneous_gaussian
from fedmcmc.models.gaussian import gaussian_mean
from fedmcmc.runtime import workers
from fedmcmc.samplers import qlsd_sharp
data = heterogeneous_gaussian(num_clients=4, dim=3)
sampler = qlsd_sharp(gaussian_mean(3), 1e-3, None, quantization(4))
pooled = fedmcmc.simulate(0, sampler, data, np.zeros(3), 3, num_chains=4, workers=2).samples
folder = workers._CACHE[0]
workers._shutdown()
alone = fedmcmc.simulate(0, sampler, data, np.zeros(3), 3, num_chains=4, workers=1).samples
print("RESULT", np.array_equal(pooled, alone), os.path.exists(folder))
"""


@pytest.mark.slow
def test_workers_compile_each_program_once():
    """Two workers (blocks of 2 chains): the first compiles init and the chunk, the second
    loads both from the pool's own compilation cache (no cache set by the user), which goes with the
    pool; the draws are those of one process."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", SHARED], capture_output=True, text=True, timeout=300,
                         env={**env, "JAX_LOG_COMPILES": "1"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["RESULT", "True", "False"]
    for program in ("chain_init", "run_chunk"):
        assert out.stderr.count(f"Persistent compilation cache hit for 'jit_{program}'") == 1, out.stderr[-3000:]


def test_default_chunks_are_equal_when_they_can_be():
    """One compiled chunk program runs the whole run when equal chunks of at most 10,000 rounds exist."""
    from fedmcmc.runtime.settings import default_chunk

    cases = [(25_000, 1), (20_000, 1), (9_999, 1), (10_007, 1), (100, 10), (10_010, 10), (60_000, 20_000)]
    assert [default_chunk(n, t) for n, t in cases] == [6_250, 10_000, 9_999, 10_000, 100, 10_000, 20_000]


def test_chains_are_computed_in_blocks_fixed_by_their_number_and_spread_over_workers_whole():
    assert [block_width(c) for c in (1, 2, 3, 4, 5, 8, 9, 17, 30, 1000)] == [1, 2, 3, 2, 3, 4, 5, 6, 8, 8]
    assert simulator._blocks(3, 2, 3) == [range(0, 3)]  # one block: one process
    assert simulator._blocks(5, 2, 3) == [range(0, 3), range(3, 5)]
    assert simulator._blocks(10, 2, 5) == [range(0, 5), range(5, 10)]
    assert simulator._blocks(30, 2, 8) == [range(0, 16), range(16, 30)]  # 4 blocks, the last padded
    assert simulator._blocks(30, 3, 8) == [range(0, 8), range(8, 24), range(24, 30)]
    assert simulator._blocks(17, 8, 6) == [range(0, 6), range(6, 12), range(12, 17)]


def test_blockwise_pads_the_last_block_and_drops_the_padding():
    calls = []

    def program(keys, x, shared):
        calls.append(keys.shape[0])
        return keys * shared, x.sum(axis=1)

    keys, x = np.arange(7), np.arange(14.0).reshape(7, 2)
    out = blockwise(program, 3, 2)(keys, x, 10)
    assert calls == [3, 3, 3]
    np.testing.assert_array_equal(out[0], keys * 10)
    np.testing.assert_array_equal(out[1], x.sum(axis=1))


ONE_THREAD = """
import os, sys
from fedmcmc.runtime import cpu
cores = os.sched_getaffinity(0)
if sys.argv[1] == "jax-first":
    import jax; jax.devices()
started = cpu.one_thread_xla()
import jax, jax.numpy as jnp
jax.block_until_ready(jnp.ones(3) + 1)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print(started, cpu.started_one_thread(), cpu.one_thread_xla(), names.count("tf_XLAEigen"),
      all(os.sched_getaffinity(int(t)) == cores for t in os.listdir("/proc/self/task")), len(cores))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins threads through Linux's affinity calls")
def test_one_thread_xla_starts_one_intra_op_thread_and_leaves_every_core():
    """Before JAX has started: XLA gets one intra-op thread (named ``tf_XLAEigen`` by XLA) and every
    thread keeps the process's cores. After: nothing changes, and it says so."""
    runs = {first: subprocess.run([sys.executable, "-c", ONE_THREAD, first], capture_output=True, text=True,
                                  timeout=120) for first in ("fedmcmc-first", "jax-first")}
    assert all(r.returncode == 0 for r in runs.values()), [r.stderr for r in runs.values()]
    started, recorded, again, pool, unpinned, cores = runs["fedmcmc-first"].stdout.split()
    assert (started, recorded, again, pool, unpinned) == ("True", "True", "True", "1", "True")
    started, recorded, again, pool, unpinned, _ = runs["jax-first"].stdout.split()
    assert (started, recorded, again, pool, unpinned) == ("False", "False", "False", cores, "True")


def test_tune_cpu_sets_the_default_number_of_workers():
    try:
        assert fedmcmc.tune_cpu(3) == 3 and fedmcmc.runtime.cpu.default_workers() == 3
        assert fedmcmc.tune_cpu() == len(fedmcmc.runtime.cpu.available_cores())
        with pytest.raises(ValueError, match="positive integer"):
            fedmcmc.tune_cpu(0)
    finally:
        fedmcmc.tune_cpu(1)
