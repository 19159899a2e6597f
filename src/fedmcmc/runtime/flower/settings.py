"""The ``[flower]`` part of a run config: its settings and their defaults, read by the server
(:class:`fedmcmc.runtime.flower.server.ServerRuntime`) and by a node's ClientApp process, which
imports no JAX (:mod:`fedmcmc.app.flower.worker`)."""

#: Default settings of the ``[flower]`` part of a run (``ServerRuntime`` keyword arguments).
DEFAULTS = {"round_timeout": 120.0, "max_upload_norm": 1e8, "poll_interval": 0.1, "hold": False,
            "secure_aggregation": False}


def flower_settings(cfg: dict) -> dict:
    """The ``[flower]`` settings of the parsed run config ``cfg``, defaults filled in."""
    return {**DEFAULTS, **cfg.get("flower", {})}
