import os
import shutil
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One OpenBLAS thread in the test processes and every process they start (NumPy's and SciPy's
# BLAS, and jaxlib's LAPACK kernels, which are SciPy's). `make test` runs four workers on two
# cores; a BLAS call split over two threads then waits, spinning, for a thread that is not
# running: eigvalsh of a 784 x 784 matrix under the suite's load took 1.8-3.2 s of CPU with two
# threads and 0.47 s with one (2026-11-25). Every test passes either way.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(__file__))

# One XLA compilation cache for the whole test session, shared by the xdist workers and every
# process the tests start (CLI runs, worker pools, Flower nodes): many tests compile the same
# sampler on the same problem in different processes. It starts empty in every session (a fresh
# folder, removed at the end), so a run measures the same work each time; a cached executable is
# the compiled one, bit for bit (the golden-draws test checks samples through it).
# The Flower nodes' own cache of compiled programs (the user's cache folder, XDG_CACHE_HOME) is
# put in the same session folder.
if "PYTEST_XDIST_WORKER" not in os.environ and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="fedmcmc-tests-xla-")
    os.environ.update(JAX_COMPILATION_CACHE_DIR=_cache, XDG_CACHE_HOME=os.path.join(_cache, "user-cache"),
                      JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
                      FEDMCMC_TESTS_OWN_XLA_CACHE="1")

# XLA on one intra-op thread in every test process, as in every fedmcmc process (the command line,
# worker processes, Flower apps and node workers; fedmcmc.runtime.cpu.one_thread_xla): the programs
# compiled here are theirs (the thread count is in the programs).
from fedmcmc.runtime.cpu import one_thread_xla  # noqa: E402

one_thread_xla()

# Longest files first (measured with --durations=0), in this order: `make test` spreads files over
# several workers (in this order with --no-loadscope-reorder; xdist's default puts the files of
# most tests first), and these would otherwise start last and run alone at the end. The deployment
# test starts first because it mostly waits on Flower's polling, which the other workers fill.
SLOWEST_FIRST = ("test_flower_deploy.py", "test_no_hang.py", "test_conformance.py", "test_fa_hmc.py",
                 "test_runtime.py", "test_qlsd_mean_recursion.py", "test_step.py", "test_tutorial.py",
                 "test_no_tuning.py", "test_cli.py", "test_flower.py", "test_dsgld.py", "test_dsgld_experiments.py",
                 "test_posterior_check_runs.py", "test_qlsd_bnn_experiment.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: SLOWEST_FIRST.index(item.path.name) if item.path.name in SLOWEST_FIRST
               else len(SLOWEST_FIRST))


def pytest_unconfigure(config):
    if os.environ.get("FEDMCMC_TESTS_OWN_XLA_CACHE") and "PYTEST_XDIST_WORKER" not in os.environ:
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
