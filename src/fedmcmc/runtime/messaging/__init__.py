"""The federated runtime over messages: a server loop and clients that each read only their own data.

* :mod:`fedmcmc.runtime.messaging.server` -- the server loop over a transport (Flower's ``Grid``, or direct calls).
* :mod:`fedmcmc.runtime.messaging.client` -- one client's side, all chains, its own data.
* :mod:`fedmcmc.runtime.messaging.wire` -- uploads in the compressor's encoding, validated on arrival.
* :mod:`fedmcmc.runtime.messaging.stored_programs` -- a client's compiled programs kept on disk for the next process.

The Flower ``ServerApp`` and ``ClientApp`` that carry these over Flower (flwr 1.41) and the
``fedmcmc flower sim|deploy`` launchers are in :mod:`fedmcmc.app.flower`, with the config format.
"""
