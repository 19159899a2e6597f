"""What every reproduction does first: pick its full or quick settings and apply overrides."""

from __future__ import annotations


def resolve(full: dict, quick_settings: dict, quick: bool, seed: int | None, overrides: dict | None) -> dict:
    """A copy of ``quick_settings`` (if ``quick``) or ``full``, updated with ``overrides`` (from
    ``--set``) and ``seed`` (from ``--seed``, when given)."""
    cfg = dict(quick_settings if quick else full)
    cfg.update(overrides or {})
    if seed is not None:
        cfg["seed"] = seed
    return cfg
