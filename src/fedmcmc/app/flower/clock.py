"""How long a per-message ClientApp process has run (imports nothing but the standard library, so
that a trivial ClientApp can report it too: ``fedmcmc bench --flower``)."""

from __future__ import annotations

import os
from pathlib import Path


def process_seconds() -> float | None:
    """Seconds since this process started (Linux ``/proc``, 10-ms ticks; None elsewhere)."""
    try:
        start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        return float(Path("/proc/uptime").read_text().split()[0]) - start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
