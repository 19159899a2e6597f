import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.path.insert(0, os.path.dirname(__file__))

# Longest files first: `make test` spreads files over several workers, and these would
# otherwise start last and run alone at the end (the deployment test mostly waits on Flower).
SLOWEST_FIRST = ("test_flower_deploy.py", "test_no_hang.py", "test_fahmc_experiments.py", "test_flower.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.path.name not in SLOWEST_FIRST)
