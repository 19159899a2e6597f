"""Figures without pyplot: what every layer that draws uses.

A :class:`matplotlib.figure.Figure` made directly belongs to no pyplot state and needs no
backend switch, so drawing leaves the user's matplotlib setup (backend, open figures) as it was.
"""

from __future__ import annotations

import os
from pathlib import Path


def new_figure(figsize=None, **subplots):
    """``(figure, axes)``: a figure of ``figsize`` inches with ``figure.subplots(**subplots)``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(**subplots)


def save_figure(fig, path: str | os.PathLike) -> Path:
    """Write ``fig`` to ``path`` (format from the suffix), making its folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path
