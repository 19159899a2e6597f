"""fedmcmc on Flower (flwr 1.41): every sampler's server and client sides as a ServerApp and a
ClientApp, with the simulator's samples (docs/flower.md).

* :mod:`fedmcmc.flower.runtime` -- the server loop and the client, without Flower.
* :mod:`fedmcmc.flower.wire` -- uploads in the compressor's encoding, validated on arrival.
* :mod:`fedmcmc.flower.apps` -- the Flower ``server_app`` and ``client_app``.
* :mod:`fedmcmc.flower.launch` -- ``fedmcmc flower sim|deploy``.
"""
