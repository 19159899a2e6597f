"""Federated data: padded per-client arrays, data sets, splits, partitions and synthetic problems.

The modules, by concern: :mod:`~fedmcmc.data.federated` (clients' data as one padded pytree),
:mod:`~fedmcmc.data.dataset` (a data set in memory), :mod:`~fedmcmc.data.builtin` (the one
registry of offline classification and regression sets), :mod:`~fedmcmc.data.files` (readers of
users' IDX, CSV, LIBSVM and LEAF JSON files), :mod:`~fedmcmc.data.local` (one client's own file read,
checked, split and standardised from aggregated moments: the ``[data]`` of a run config), :mod:`~fedmcmc.data.splits` (train/test splits
scaled with training statistics), :mod:`~fedmcmc.data.partition` (non-IID partitions over
clients) and :mod:`~fedmcmc.data.synthetic` (the papers' synthetic problems). This face gathers
what users call.
"""

from fedmcmc.data import local, partition, synthetic
from fedmcmc.data.builtin import DATASETS, load_dataset
from fedmcmc.data.dataset import Dataset
from fedmcmc.data.federated import FederatedData, from_clients
from fedmcmc.data.files import LeafData, load_csv, load_idx, load_leaf_json, load_libsvm, read_idx
from fedmcmc.data.splits import Split, pca_project, split_and_standardise, with_intercept

__all__ = ["FederatedData", "from_clients", "Dataset", "DATASETS", "load_dataset", "read_idx", "load_idx", "load_csv",
           "load_libsvm", "load_leaf_json", "LeafData", "Split", "split_and_standardise", "with_intercept",
           "pca_project", "local", "partition", "synthetic"]
