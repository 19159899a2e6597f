import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

# Longest files first (measured with --durations=0), in this order: `make test` spreads files over
# several workers, and these would otherwise start last and run alone at the end. The deployment
# test starts first because it mostly waits on Flower's polling, which the other workers fill.
SLOWEST_FIRST = ("test_flower_deploy.py", "test_no_hang.py", "test_fa_hmc.py", "test_flower.py",
                 "test_qlsd_mean_recursion.py", "test_runtime.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: SLOWEST_FIRST.index(item.path.name) if item.path.name in SLOWEST_FIRST
               else len(SLOWEST_FIRST))
