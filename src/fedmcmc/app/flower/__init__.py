"""fedmcmc on Flower (flwr 1.41): every sampler of a ``fedmcmc run`` config as a ServerApp and a
ClientApp, with the simulator's samples (docs/flower.md).

* :mod:`fedmcmc.app.flower.apps` -- the Flower ``server_app`` and ``client_app``.
* :mod:`fedmcmc.app.flower.content` -- a runtime message as Flower records, both ways.
* :mod:`fedmcmc.app.flower.replies` -- a node's answer to a message (in the ClientApp or the node worker).
* :mod:`fedmcmc.app.flower.grid` -- the ServerApp's transport over Flower's ``Grid``.
* :mod:`fedmcmc.app.flower.nodes` -- a ``[data]`` run's node-local data.
* :mod:`fedmcmc.app.flower.launch` -- ``fedmcmc flower sim|deploy``.
* :mod:`fedmcmc.app.flower.node_worker` -- ``fedmcmc node-worker``: a node's fedmcmc work in one long-lived process.
* :mod:`fedmcmc.app.flower.clock` -- a ClientApp process's age (``fedmcmc bench --flower``).
"""

import os

# before any module of this package imports Flower
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
