"""Federated data: padded per-client arrays, partitioners and built-in problems."""

from fedmcmc.data import partition
from fedmcmc.data.datasets import (Dataset, load_classification, load_csv, load_idx, load_leaf_json, load_libsvm,
                                   split_and_standardise)
from fedmcmc.data.federated import FederatedData, from_clients

__all__ = ["FederatedData", "from_clients", "Dataset", "load_classification", "split_and_standardise", "load_idx",
           "load_csv", "load_libsvm", "load_leaf_json", "partition"]
