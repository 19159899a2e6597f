"""The contract between algorithms and runtimes.

Every federated sampler is a :class:`FederatedSampler`: four pure functions that the
vectorised simulator (:func:`fedmcmc.simulate`) and the message runtime both call.
Keys are always the first argument; states and infos are NamedTuples.

Round ``k`` of a run, for one chain::

    mask             = participation.sample(participation_key, num_clients)
    for every client i (vectorised):   # the client sees only its own data
        client_state_i, upload_i, cinfo_i = client_step(key_i, client_state_i, broadcast, data_i, k)
    server_state, broadcast, sinfo = server_step(server_key, server_state, uploads, mask, k)
    sample_k         = server_state.position   (or the rows of server_state.draws, see below)

Before round 1, a sampler with a :class:`Setup` runs one exchange with every client:
surrogates or statistics computed where the data lives, combined by the server and sent back
once (CG-DSGLD's Gaussian surrogates). A sampler whose chain moves several times per round
(DSGLD, whose chain runs many local steps on one shard per visit) sets ``draws_per_round``
and keeps that round's draws in ``server_state.draws``.

Inactive clients (``mask[i] == False``) keep their state and their upload is ignored.
The round number ``k`` is given by the runtime, the same for every chain: step-size
schedules and periodic events (SVRG refreshes, synchronisations) branch on it with
``lax.cond``, which stays a real branch when chains are vectorised.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple

import jax
import numpy as np

from fedmcmc.core.types import Array


@partial(jax.tree_util.register_dataclass, data_fields=["x", "row_client", "order"],
         meta_fields=["buckets", "n_max"])
@dataclass(frozen=True)
class Rows:
    """The data points of all clients a process holds, clients of similar sizes padded together.

    Attributes
    ----------
    x
        Pytree of arrays with leading axis ``R``: bucket after bucket, a bucket of ``m`` clients
        of width ``w`` holds ``m w`` rows, ``w`` per client; a client's points fill its first
        rows, the rest are zeros.
    row_client
        The client of each row, -1 for padding (int32 ``[R]``).
    order
        The clients in the order of their rows (int32 ``[b]``).
    buckets
        ``((m, w), ...)`` of the buckets (static).
    n_max
        The largest number of points of a client (static): the bound of a minibatch draw.
    """

    x: Any
    row_client: Any
    order: Any
    buckets: tuple
    n_max: int

    @property
    def num_clients(self) -> int:
        return int(np.shape(self.order)[0])


class ClientData(NamedTuple):
    """One client's data as the client sees it: its points are ``count`` rows of ``rows``
    from ``start`` on (see :data:`CLIENT_AXES` for running clients under ``vmap``).

    Attributes
    ----------
    rows
        The packed points (:class:`Rows`), shared by every client of a process: a client reads
        only its own rows (a Flower node holds no other client's points).
    count
        Number of real data points ``N_i`` (int scalar).
    index
        Client index ``i`` (int scalar); used for per-client settings such as the
        number of quantisation levels or the participation probability.
    start
        The row of ``rows`` that holds the client's first point (int scalar).
    """

    rows: Rows
    count: Array
    index: Array
    start: Array

    def take(self, idx) -> "ClientData":
        """The clients at positions ``idx`` of a batch of clients (the rows stay shared)."""
        return self._replace(count=self.count[idx], index=self.index[idx], start=self.start[idx])


#: ``vmap`` axes of a batch of clients: one count, index and start per client, the rows shared.
CLIENT_AXES = ClientData(rows=None, count=0, index=0, start=0)


class Model(NamedTuple):
    """A Bayesian model: pi(theta | D) ∝ prior(theta) prod_ij p(x_ij | theta).

    ``theta`` is a flat vector of dimension ``dim`` (models unflatten internally, so
    that every message is a flat vector that compressors can encode).

    Attributes
    ----------
    log_likelihood
        ``log_likelihood(theta, datum) -> scalar``, the log-density of one data point.
    log_prior
        ``log_prior(theta) -> scalar``; counted once, on the server.
    dim
        Dimension ``d`` of ``theta``.
    name
        Short name used in outputs.
    predict
        Optional ``predict(theta, inputs) -> predictions`` for a batch of inputs: class
        probabilities ``[n, K]`` for classifiers, predictive means ``[n]`` for regression.
        Predictive metrics average it over posterior draws (the Bayesian model average).
    layout
        Optional :class:`fedmcmc.models.layout.ParamLayout` naming the blocks of ``theta``
        (weight matrices, biases); outputs name the posterior's variables and dimensions
        after it. None: ``theta`` is one vector.
    """

    log_likelihood: Callable[[Array, Any], Array]
    log_prior: Callable[[Array], Array]
    dim: int
    name: str = "model"
    predict: Callable[[Array, Any], Array] | None = None
    layout: Any = None


class CompressionInfo(NamedTuple):
    """What a compressor reports about one message.

    Attributes
    ----------
    bits
        Exact length in bits of the encoded message (int32), equal to what the wire
        codec writes before padding to whole bytes.
    """

    bits: Array


class Compressor(NamedTuple):
    """An unbiased compression operator that owns its message, Optax-shaped.

    ``init(v_like, index) -> state`` builds the state of client ``index``;
    ``apply(key, v, state) -> (message, state, CompressionInfo)`` compresses ``v`` into the
    message a client uploads (a pytree of arrays; ``CompressionInfo.bits`` is its encoded
    length); ``decode(message) -> v_hat`` is what the receiver computes, with E[v_hat] = v
    and E||v_hat - v||^2 <= omega ||v||^2, and must give 0 for an all-zero message (the
    runtimes hold zeros for inactive clients); ``omega(d)`` gives omega for vectors of
    dimension ``d`` (a scalar, or an array over clients for per-client compressors).
    ``aggregate(weights, messages) -> sum_i w_i v_hat_i`` (over a leading client axis) is how
    the server sums them, when not the float sum of the decoded messages (None;
    :func:`fedmcmc.compression.weighted_sum` picks).
    """

    init: Callable[..., Any]
    apply: Callable[..., tuple]
    decode: Callable[[Any], Any]
    omega: Callable[[int], Any]
    name: str = "compressor"
    aggregate: Callable[..., Any] | None = None


class Participation(NamedTuple):
    """Which clients take part in a round, and how their uploads are weighted.

    Attributes
    ----------
    sample
        ``sample(key, num_clients) -> mask`` (bool, shape ``[num_clients]``).
    weights
        ``weights(mask) -> w`` (float, shape ``[num_clients]``): the factor applied to each
        upload when the server sums them; zero for inactive clients.
    pause_when_empty
        If True, a round with no active client leaves the chain where it is (the server
        waits); if False, the likelihood term of that round is zero.
    name
        Short name used in outputs.
    num_clients
        The number of clients its per-client settings are for (None if it has none).
    max_active
        An upper bound on the number of active clients in any round, or None. When it is
        set, the simulator runs ``client_step`` for at most that many clients instead of all
        of them (same keys, same results).
    probs
        ``p_i``, the probability that client ``i`` is active in a round: a float, or a tuple
        with one entry per client (hashable, like the rest of a sampler); None if the scheme
        has none. QLSD++'s memory update of eq. S45 divides by it.
    """

    sample: Callable[[Array, int], Array]
    weights: Callable[[Array], Array]
    pause_when_empty: bool = False
    name: str = "participation"
    num_clients: int | None = None
    max_active: int | None = None
    probs: Any = None


class Setup(NamedTuple):
    """A one-off exchange before round 1, with every client.

    ``client(key, client_state, broadcast, client_data) -> (client_state, upload, info)`` runs on
    every client (``info.bits`` is the upload's size on the wire);
    ``server(key, server_state, uploads) -> (server_state, message, info)`` combines the uploads
    (leading client axis) into one ``message`` sent to every client (``info.broadcast_bits`` is
    its size); ``receive(client_state, message) -> client_state`` stores it on each client.
    ``check(client_states)``, if given, runs on the host after the exchange, on the clients'
    states as NumPy arrays (leading axes: chains, clients), and raises a one-line ``ValueError``
    naming the client whose setup failed.
    """

    client: Callable[..., tuple]
    server: Callable[..., tuple]
    receive: Callable[..., Any]
    check: Callable[[Any], None] | None = None


class FederatedSampler(NamedTuple):
    """A federated MCMC algorithm as four pure functions (see the module docstring).

    Attributes
    ----------
    init
        ``init(key, theta0) -> (server_state, broadcast)``; ``server_state.position`` is
        the current sample.
    client_init
        ``client_init(key, broadcast, client_data) -> client_state``: surrogates, memory
        terms, control variates, built where the data lives.
    client_step
        ``client_step(key, client_state, broadcast, client_data, k) -> (client_state, upload, info)``;
        ``info.bits`` is the exact size in bits of ``upload`` on the wire.
    server_step
        ``server_step(key, server_state, uploads, mask, k) -> (server_state, broadcast, info)``;
        ``uploads`` carries a leading client axis.
    participation
        The participation scheme the server uses to draw ``mask``.
    name
        Short name used in outputs.
    num_clients
        The number of clients its per-client settings (batch sizes, quantisation levels,
        participation probabilities) are for, or None; the runtime checks it against the data,
        since a per-client value is looked up by client index.
    setup
        A :class:`Setup` exchange run once before round 1, or None.
    draws_per_round
        ``m``: the number of draws a round yields. If ``m > 1``, ``server_state.draws`` is
        ``[m, d]``, the round's draws in order, and the runtime records them all.

    Examples
    --------
    A complete sampler, federated Langevin dynamics with exact local gradients: each client
    uploads ``grad U_i(theta)``, the gradient of its potential, and the server steps

        theta' = theta - gamma [grad U_0(theta) + sum_i w_i grad U_i(theta)] + sqrt(2 gamma) Z,

    with ``U_0 = -log prior`` and ``w_i`` the participation weights (the Langevin algorithm on
    the posterior, Roberts and Tweedie 1996). Its states are NamedTuples and every function
    takes its key first:

    >>> from typing import NamedTuple
    >>> import jax, jax.numpy as jnp, numpy as np
    >>> import fedmcmc
    >>> from fedmcmc.core.base import FederatedSampler
    >>> from fedmcmc.estimators.gradients import local_gradient
    >>> from fedmcmc.samplers.messages import Broadcast, ClientInfo, ServerInfo, float_bits
    >>> from fedmcmc.samplers.participation import full
    >>> class LangevinState(NamedTuple):
    ...     position: jax.Array
    >>> def langevin(model, step_size):
    ...     participation = full()
    ...     def init(key, theta0):
    ...         theta0 = jnp.asarray(theta0, jnp.float32)
    ...         return LangevinState(theta0), Broadcast(theta0)
    ...     def client_init(key, broadcast, client_data):
    ...         return ()  # nothing kept between rounds
    ...     def client_step(key, client_state, broadcast, client_data, k):
    ...         grad = local_gradient(model, broadcast.position, client_data)
    ...         return client_state, grad, ClientInfo(bits=float_bits(grad))
    ...     def server_step(key, server_state, uploads, mask, k):
    ...         theta = server_state.position
    ...         drift = participation.weights(mask) @ uploads - jax.grad(model.log_prior)(theta)
    ...         theta = theta - step_size * drift + jnp.sqrt(2 * step_size) * jax.random.normal(key, theta.shape)
    ...         info = ServerInfo(step_size=jnp.float32(step_size), broadcast_bits=float_bits(theta))
    ...         return LangevinState(theta), Broadcast(theta), info
    ...     return FederatedSampler(init, client_init, client_step, server_step, participation, "langevin")

    Three clients estimate a Gaussian mean (whose posterior is known exactly); the draws'
    mean is within a fifth of a posterior standard deviation of the exact one:

    >>> from fedmcmc.app.problems import heterogeneous_gaussian
    >>> data, model, exact = heterogeneous_gaussian(num_clients=3, dim=2)
    >>> res = fedmcmc.simulate(0, langevin(model, 1e-3), data, np.zeros(2), 2000, num_chains=2, burn_in=200)
    >>> res.samples.shape
    (2, 1800, 2)
    >>> bool(np.all(np.abs(res.samples.mean(axis=(0, 1)) - exact.mean) < 0.2 * np.sqrt(exact.var)))
    True
    """

    init: Callable[..., tuple]
    client_init: Callable[..., Any]
    client_step: Callable[..., tuple]
    server_step: Callable[..., tuple]
    participation: Participation
    name: str = "sampler"
    num_clients: int | None = None
    setup: Setup | None = None
    draws_per_round: int = 1


def per_client_count(*settings, known=()) -> int | None:
    """The number of clients that per-client settings are for.

    ``settings`` are values that are either the same for every client (a scalar or None) or
    given per client (an array with more than one entry); ``known`` are client counts
    already established (ints, or None). Returns their common value, or None if nothing is
    per client; different lengths raise ValueError.
    """
    lengths = {int(np.size(x)) for x in settings if x is not None and np.size(x) > 1}
    lengths |= {int(n) for n in known if n}
    if len(lengths) > 1:
        raise ValueError(f"per-client settings have different lengths {sorted(lengths)}; "
                         "give one value per client for each")
    return lengths.pop() if lengths else None
