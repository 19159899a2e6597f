"""A compressor from a configuration value: :func:`resolve_compressor`, and :func:`resolve_clipped`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fedmcmc.compression.clipping import clipped
from fedmcmc.compression.fixed_point import fixed_point, grid_clip
from fedmcmc.compression.identity import identity
from fedmcmc.compression.quantization import MAX_BITS, quantization
from fedmcmc.core.base import Compressor

__all__ = ["resolve_compressor", "resolve_clipped"]

_SPEC_HELP = (
    'use None, "none", "identity" or 0 for no compression; an integer s >= 1 for s '
    'quantisation levels; {"bits": p} for s = 2**p; {"levels": s} or {"levels": [s_1, ...]} '
    "for (per-client) levels; add fixed_point = {fraction_bits = p, max_abs = M} to put the decoded "
    "uploads on the grid 2**-p Z (secure aggregation)"
)


def _bits_to_levels(bits):
    """``2**p`` for ``{"bits": p}`` (or a list of them), with ``p`` checked."""
    def one(p, where=""):
        message = (f"quantization bits p{where} must be an integer in [0, {MAX_BITS}] (got {p!r}); "
                   "p bits means s = 2**p levels")
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)) or not 0 <= p <= MAX_BITS:
            raise ValueError(message)
        return 2 ** int(p)

    if isinstance(bits, (Sequence, np.ndarray)) and not isinstance(bits, (str, bytes)):
        values = list(bits)
        if not values:
            raise ValueError('{"bits": [...]} needs at least one entry')
        return [one(p, f"[{i}]") for i, p in enumerate(values)]
    return one(bits)


def _grid(spec) -> tuple:
    """``(the spec without its fixed_point key, the grid mapping or None)``."""
    if not isinstance(spec, Mapping) or "fixed_point" not in spec:
        return spec, None
    grid = spec["fixed_point"]
    if not isinstance(grid, Mapping) or set(grid) != {"fraction_bits", "max_abs"}:
        raise ValueError(f"fixed_point must be {{fraction_bits = p, max_abs = M}} (got {grid!r})")
    return {k: v for k, v in spec.items() if k != "fixed_point"} or None, grid


def resolve_clipped(spec, bound: float, dim: int, clients: int = 1) -> Compressor:
    """:func:`resolve_compressor`'s compressor for ``spec`` whose uploads, as the server sums them,
    have norm at most ``bound``: :func:`~fedmcmc.compression.clipped` around it, or, for a spec
    with ``fixed_point``, inside the grid with the bound lowered by the grid's rounding
    (:func:`~fedmcmc.compression.fixed_point.grid_clip`, for uploads of dimension ``dim``) and
    checked for sums of ``clients`` uploads."""
    rest, grid = _grid(spec)
    if grid is None:
        return clipped(resolve_compressor(spec), bound)
    inner = clipped(resolve_compressor(rest), grid_clip(bound, grid["fraction_bits"], dim))
    return fixed_point(inner, grid["fraction_bits"], grid["max_abs"], clients)


def resolve_compressor(spec, clients: int = 1) -> Compressor:
    """Build a compressor from a configuration value.

    Parameters
    ----------
    spec
        * ``None``, ``"none"``, ``"identity"`` or ``0``: :func:`identity`;
        * an integer ``s >= 1``: ``quantization(s)``;
        * a sequence of integers: ``quantization(levels)`` (one per client);
        * ``{"bits": p}`` (``p`` in ``[0, 24]`` (``MAX_BITS``), or a list of them): ``quantization(2**p)``;
        * ``{"levels": s}`` or ``{"levels": [s_1, ..., s_b]}``: ``quantization(levels)``;
        * any mapping above (or an empty one, for the identity) with a key ``fixed_point =
          {"fraction_bits": p, "max_abs": M}``: that compressor wrapped in
          :func:`~fedmcmc.compression.fixed_point.fixed_point`;
        * a :class:`~fedmcmc.core.base.Compressor`: returned unchanged.
    clients
        How many uploads the server sums: a ``fixed_point`` grid whose int32 sum of that many
        uploads could wrap is refused.

    Returns
    -------
    Compressor

    Raises
    ------
    ValueError
        For any other value, with a message listing the accepted forms.
    """
    if spec is None or isinstance(spec, Compressor):
        return identity() if spec is None else spec
    if isinstance(spec, str):
        if spec.strip().lower() in ("none", "identity"):
            return identity()
        raise ValueError(f"unknown compressor spec {spec!r}; {_SPEC_HELP}")
    if isinstance(spec, (bool, np.bool_)):
        raise ValueError(f"invalid compressor spec {spec!r}; {_SPEC_HELP}")
    if isinstance(spec, (int, np.integer)) and spec == 0:
        return identity()
    if isinstance(spec, (int, float, np.integer, np.floating)):
        return quantization(spec)  # validates: integer >= 1
    rest, grid = _grid(spec)
    if grid is not None:
        return fixed_point(resolve_compressor(rest), grid["fraction_bits"], grid["max_abs"], clients)
    if isinstance(spec, Mapping):
        keys = set(spec)
        if keys == {"bits"}:
            return quantization(_bits_to_levels(spec["bits"]))
        if keys == {"levels"}:
            return quantization(spec["levels"])
        raise ValueError(
            f"compressor spec dict must have exactly one key, 'bits' or 'levels' "
            f"(got keys {sorted(map(str, keys))}); {_SPEC_HELP}"
        )
    if isinstance(spec, (Sequence, np.ndarray)):
        return quantization(spec)
    raise ValueError(f"invalid compressor spec {spec!r}; {_SPEC_HELP}")
