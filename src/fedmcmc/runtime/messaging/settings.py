"""The ``[flower]`` part of a run config: its settings and their defaults, read by the server
(:class:`fedmcmc.runtime.flower.server.ServerRuntime`), the clients
(:class:`fedmcmc.runtime.flower.client.ClientRuntime`), the config check
(:mod:`fedmcmc.app.config`) and a node's ClientApp process, which imports no JAX
(:mod:`fedmcmc.app.flower.worker`)."""

#: Every setting of the ``[flower]`` part of a run, with its default (docs/flower.md).
DEFAULTS = {"round_timeout": 120.0, "max_upload_norm": "auto", "exact": True, "poll_interval": 0.1, "hold": False,
            "secure_aggregation": False, "secure_min_clients": 2}


def flower_settings(cfg: dict) -> dict:
    """The ``[flower]`` settings of the parsed run config ``cfg``, defaults filled in."""
    return {**DEFAULTS, **cfg.get("flower", {})}
