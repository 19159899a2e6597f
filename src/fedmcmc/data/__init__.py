"""Federated data: padded per-client arrays, partitioners and built-in problems."""

from fedmcmc.data.federated import FederatedData, from_clients

__all__ = ["FederatedData", "from_clients"]
