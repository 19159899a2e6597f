"""fedmcmc on Flower (flwr 1.41): every sampler of a ``fedmcmc run`` config as a ServerApp and a
ClientApp, with the simulator's samples (docs/flower.md).

* :mod:`fedmcmc.app.flower.apps` -- the Flower ``server_app`` and ``client_app``.
* :mod:`fedmcmc.app.flower.grid` -- the ServerApp's transport over Flower's ``Grid``.
* :mod:`fedmcmc.app.flower.launch` -- ``fedmcmc flower sim|deploy``.
* :mod:`fedmcmc.app.flower.worker` -- ``fedmcmc node-worker``: a node's fedmcmc work in one long-lived process.
* :mod:`fedmcmc.app.flower.clock` -- a ClientApp process's age (``fedmcmc bench --flower``).
"""
