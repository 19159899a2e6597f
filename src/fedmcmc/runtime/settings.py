"""The ``[run]`` and ``[flower]`` settings of a run config, typed and checked in one place.

:class:`RunSettings` and :class:`FlowerSettings` are frozen dataclasses whose construction checks
every value: a bad one is refused with one :class:`ConfigError` line naming the key, the value
and the fix. :meth:`Settings.from_config` makes both from a parsed config;
:func:`fedmcmc.app.config.validate` calls it where a config is read, and the run it builds carries
the result (:attr:`fedmcmc.app.config.Built.settings`) to the simulator path
(:func:`fedmcmc.app.config.run`), to the Flower server and clients
(:class:`~fedmcmc.runtime.messaging.server.ServerRuntime`,
:class:`~fedmcmc.runtime.messaging.client.ClientRuntime`) and to the ServerApp's transport
(:class:`~fedmcmc.app.flower.grid.GridTransport`). Each field's ``metadata["doc"]`` is its line of
``docs/reference/config.md`` (:mod:`fedmcmc.app.reference`).

The parsed config itself still travels as it was given: it is hashed into a run's identity
(:func:`fedmcmc.app.config.identity`) and sent as TOML text to the Flower clients.

This module imports no JAX: a node's ClientApp process that relays its messages to a node worker
reads the ``[flower]`` settings with it (:mod:`fedmcmc.app.flower.worker`).
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping

__all__ = ["ConfigError", "FlowerSettings", "RunSettings", "Settings", "check_schedule", "default_chunk",
           "INITS", "MAX_STORED_DRAWS", "MIN_SECURE_CLIENTS"]

#: Draws per chain that ``fedmcmc run`` stores in ``posterior.nc`` unless ``[run] max_stored_draws`` says otherwise.
MAX_STORED_DRAWS = 2000
#: ``[run] init`` values that are words (:func:`fedmcmc.app.posterior.starts`).
INITS = ("dispersed", "mode", "zeros")
#: The fewest clients whose sum a round of secure aggregation may reveal (``[flower] secure_min_clients``,
#: at least this; :mod:`fedmcmc.runtime.messaging.secagg`).
MIN_SECURE_CLIENTS = 2


class ConfigError(ValueError):
    """An invalid run configuration (one line: the setting, its value and the fix)."""


def default_chunk(num_iterations: int, thinning: int, most: int = 10_000) -> int:
    """Rounds per chunk by default: a multiple of ``thinning``, at most ``most`` rounds (or one
    draw's), and the same for every chunk when ``c`` to ``2 c`` chunks can be equal (``c`` the
    fewest that fit), so that one compiled program runs them all (25,000 rounds: four chunks of
    6,250, not 10,000, 10,000 and 5,000); otherwise the fewest chunks and a shorter last one."""
    draws, per_chunk = num_iterations // thinning, max(1, most // thinning)
    fewest = -(-draws // per_chunk)
    equal = next((c for c in range(fewest, 2 * fewest + 1) if draws % c == 0), None)
    return (draws // equal if equal else per_chunk if fewest > 1 else draws) * thinning


def check_schedule(num_iterations, num_chains, burn_in, thinning, chunk_size) -> int:
    """A run's schedule checked (one line naming the problem and the fix): the check of
    :func:`fedmcmc.simulate`'s arguments and of :class:`RunSettings`. Returns the chunk size
    (default: :func:`default_chunk`).

    Raises
    ------
    ValueError
        A count that is not a positive integer, ``burn_in`` outside ``[0, num_iterations)``,
        ``num_iterations`` not a multiple of ``thinning``, or a ``chunk_size`` that is not a
        positive multiple of ``thinning``.
    """
    for label, value in (("num_iterations", num_iterations), ("num_chains", num_chains), ("thinning", thinning)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 1:
            raise ValueError(f"{label} must be a positive integer (got {value!r})")
    if isinstance(burn_in, bool) or not isinstance(burn_in, (int, float)) or int(burn_in) != burn_in \
            or not 0 <= burn_in < num_iterations:
        raise ValueError(f"burn_in must be an integer in [0, num_iterations) (got {burn_in!r})")
    if num_iterations % thinning:
        raise ValueError(f"num_iterations ({num_iterations}) must be a multiple of thinning ({thinning})")
    if chunk_size is None:
        chunk_size = default_chunk(num_iterations, thinning)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, float)) or int(chunk_size) != chunk_size or chunk_size % thinning or chunk_size < 1:
        raise ValueError(f"chunk_size ({chunk_size}) must be a positive multiple of thinning ({thinning})")
    return chunk_size


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _doc(text: str, **more) -> dict:
    return {"doc": text, **more}


class _Section:
    """What both settings classes share: the section's name, its keys, and :meth:`from_section`."""

    SECTION = ""

    @classmethod
    def keys(cls) -> tuple[str, ...]:
        """The keys the section may set, in the order of the reference."""
        return tuple(f.name for f in fields(cls))

    @classmethod
    def required(cls) -> tuple[str, ...]:
        """The keys the section must set."""
        return tuple(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)

    @classmethod
    def from_section(cls, section: Mapping[str, Any] | None):
        """The settings of a parsed config section (a dict; None: an empty one), every value checked.

        Raises
        ------
        ConfigError
            An unknown key, a required key left out, or a bad value: one line naming the key,
            the value and the fix.
        """
        section = dict(section or {})
        unknown = set(section) - set(cls.keys())
        if unknown:
            raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{cls.SECTION}]; allowed: {sorted(cls.keys())}")
        for key in cls.required():
            if key not in section:
                raise ConfigError(f"[{cls.SECTION}] needs {key}")
        return cls(**section)

    def _refuse(self, key: str, text: str):
        raise ConfigError(f"[{self.SECTION}] {key} {text}")

    def _set(self, key: str, value) -> None:
        object.__setattr__(self, key, value)  # a frozen dataclass's own normalisation, in __post_init__


@dataclass(frozen=True, kw_only=True)
class RunSettings(_Section):
    """The ``[run]`` section: how many chains and rounds, and what the run does around the sampler.

    Attributes
    ----------
    seed
        Seed of the run's randomness (an integer).
    num_chains, num_iterations
        Chains, and rounds per chain (positive integers; ``num_iterations`` a multiple of ``thinning``).
    burn_in, thinning
        Rounds dropped at the start of each chain (in ``[0, num_iterations)``), and every how many
        rounds a draw is kept.
    chunk_size
        Rounds between checkpoints (a positive multiple of ``thinning``), None: chosen by the runtime.
    devices
        Local GPUs to spread the chains over (a positive integer), None: all of them.
    init
        ``"dispersed"``, ``"mode"``, ``"zeros"``, values (a tuple of numbers, or of tuples of
        numbers: one point per chain), or None (:func:`fedmcmc.app.posterior.starts`).
    posterior_check, max_stored_draws, whiten
        Whether the draws are compared with the Laplace approximation; draws per chain stored in
        ``posterior.nc`` (0: all); ``"auto"``, True or False (:mod:`fedmcmc.app.whiten`).

    Raises
    ------
    ConfigError
        On construction, for a bad value (one line naming the key, the value and the fix).
    """

    SECTION = "run"

    seed: int = field(default=0, metadata=_doc("Seed of the run's randomness (the chains, the dispersed starts)."))
    num_chains: int = field(metadata=_doc("Number of chains."))
    num_iterations: int = field(metadata=_doc("Rounds per chain (a multiple of `thinning`)."))
    burn_in: int = field(default=0, metadata=_doc("Rounds dropped at the start of each chain, in "
                                                  "`[0, num_iterations)`."))
    thinning: int = field(default=1, metadata=_doc("Keep every k-th round."))
    chunk_size: int | None = field(default=None, metadata=_doc(
        "Rounds between checkpoints under the output folder's `chunks/` (a multiple of `thinning`); default "
        "chosen from the run's length."))
    devices: int | None = field(default=None, metadata=_doc(
        "Number of local GPUs to spread the chains over; default all. The samples do not depend on it."))
    init: str | tuple | None = field(default=None, metadata=_doc(
        'The chains\' starting points: `"dispersed"` (draws from the Laplace approximation with doubled standard '
        'deviations), `"mode"`, `"zeros"`, or a list of values (one point, or one per chain). Default `"dispersed"` '
        'where the approximation exists and there is no `[privacy]`, else `"zeros"`.'))
    posterior_check: bool = field(default=True, metadata=_doc(
        "Compare the draws with the Laplace approximation at the mode and exit with code 4 when a marginal is off."))
    max_stored_draws: int = field(default=MAX_STORED_DRAWS, metadata=_doc(
        "Draws per chain stored in `posterior.nc`, thinned evenly (0: all)."))
    whiten: str | bool = field(default="auto", metadata=_doc(
        'Run the sampler in coordinates `z`, `theta = theta* + L z` with `L L^T = H^-1`: `"auto"` (with '
        '`step_size = "auto"`, where the approximation exists and without `[privacy]`), true or false.'))

    def __post_init__(self):
        if not _integer(self.seed):
            self._refuse("seed", f"must be an integer (got {self.seed!r})")
        if not (self.devices is None or (_integer(self.devices) and self.devices >= 1)):
            self._refuse("devices", f"must be a positive integer, or unset for every local GPU/TPU (got "
                                    f"{self.devices!r})")
        try:
            check_schedule(self.num_iterations, self.num_chains, self.burn_in, self.thinning, self.chunk_size)
        except ValueError as err:
            raise ConfigError(f"[run] {err}") from None
        for key in ("num_chains", "num_iterations", "burn_in", "thinning", "chunk_size"):
            if getattr(self, key) is not None:
                self._set(key, int(getattr(self, key)))
        self._set("init", self._init(self.init))
        if not isinstance(self.posterior_check, bool):
            self._refuse("posterior_check", f"must be true or false (got {self.posterior_check!r})")
        if not _integer(self.max_stored_draws) or self.max_stored_draws < 0:
            self._refuse("max_stored_draws", f"must be an integer >= 0 (0 stores every draw; got "
                                             f"{self.max_stored_draws!r})")
        if not (self.whiten == "auto" or isinstance(self.whiten, bool)):
            self._refuse("whiten", f'must be "auto", true or false (got {self.whiten!r})')

    def _init(self, init):
        """``init`` as a word, None, or values as tuples (their shape is checked against the
        model's dimension where the starts are made: :func:`fedmcmc.app.posterior.starts`)."""
        if init is None or init in INITS:
            return init
        if isinstance(init, (list, tuple)) and init:
            rows = init if all(isinstance(row, (list, tuple)) for row in init) else [init]
            if all(_number(x) for row in rows for x in row) and all(rows):
                return tuple(tuple(row) for row in init) if rows is init else tuple(init)
        self._refuse("init", f"must be one of {INITS} or a list of numbers (got {init!r})")


@dataclass(frozen=True, kw_only=True)
class FlowerSettings(_Section):
    """The ``[flower]`` section: the Flower runtime's settings (docs/flower.md; ``fedmcmc run`` checks them and runs without them).

    Attributes
    ----------
    round_timeout
        Seconds a round waits for the clients' replies (a positive number, as a float).
    max_upload_norm
        ``"auto"`` (the server's bound from recent norms, :mod:`fedmcmc.runtime.messaging.server`) or a
        fixed positive bound on each part of an upload.
    exact
        Whether each client computes on ``b`` copies of itself, for the simulator's draws bit for bit.
    poll_interval
        Seconds between the server's checks for replies, in ``(0, 10]`` (as a float).
    hold
        Whether a ``hold`` message follows each message to its node.
    secure_aggregation, secure_min_clients
        Whether the server sees only the sum of the active clients' uploads, and the fewest
        clients whose sum is revealed (at least :data:`MIN_SECURE_CLIENTS`).

    Raises
    ------
    ConfigError
        On construction, for a bad value (one line naming the key, the value and the fix).
    """

    SECTION = "flower"

    round_timeout: float = field(default=120.0, metadata=_doc(
        "Seconds a round waits for the clients' replies; a client that misses it is inactive."))
    max_upload_norm: str | float = field(default="auto", metadata=_doc(
        'Bound on the norm of each part of an upload; a larger one is rejected. `"auto"`: 100 times the lower '
        "median of that part's recent norms; a number: a fixed bound."))
    exact: bool = field(default=True, metadata=_doc(
        "Each client runs its step on `b` copies of itself (b clients), so that the draws equal the simulator's "
        "bit for bit, at `b` times the compute; false: one copy, equal to float rounding."))
    poll_interval: float = field(default=0.1, metadata=_doc("Seconds between the server's checks for replies."))
    hold: bool = field(default=False, metadata=_doc(
        "Queue a `hold` message behind each message, so that a node finds work instead of sleeping between rounds "
        "(one more ClientApp process per node and round)."))
    secure_aggregation: bool = field(default=False, metadata=_doc(
        "The server learns only the sum of the active clients' uploads (needs a `fixed_point` compression)."))
    secure_min_clients: int = field(default=MIN_SECURE_CLIENTS, metadata=_doc(
        f"Fewest active clients whose secure sum is revealed (at least {MIN_SECURE_CLIENTS})."))

    def __post_init__(self):
        if not (_number(self.round_timeout) and self.round_timeout > 0):
            self._refuse("round_timeout", f"must be a positive number of seconds (got {self.round_timeout!r}); the "
                                          "default is 120")
        self._set("round_timeout", float(self.round_timeout))
        if self.max_upload_norm != "auto" and not (_number(self.max_upload_norm) and self.max_upload_norm > 0):
            self._refuse("max_upload_norm", f'must be "auto" or a positive number (got {self.max_upload_norm!r})')
        if not (_number(self.poll_interval) and 0 < self.poll_interval <= 10):
            self._refuse("poll_interval", f"must be in (0, 10] seconds (got {self.poll_interval!r}); the default "
                                          "is 0.1")
        self._set("poll_interval", float(self.poll_interval))
        for key in ("exact", "hold", "secure_aggregation"):
            if not isinstance(getattr(self, key), bool):
                default = str(getattr(type(self), key)).lower()
                self._refuse(key, f"must be true or false (got {getattr(self, key)!r}); the default is {default}")
        if not _integer(self.secure_min_clients) or self.secure_min_clients < MIN_SECURE_CLIENTS:
            self._refuse("secure_min_clients", f"must be an integer >= {MIN_SECURE_CLIENTS} (got "
                                               f"{self.secure_min_clients!r}): the sum of one client is its upload")


@dataclass(frozen=True)
class Settings:
    """A run config's typed settings: its ``[run]`` and its ``[flower]`` (defaults if absent)."""

    run: RunSettings
    flower: FlowerSettings = field(default_factory=FlowerSettings)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Settings:
        """The settings of a parsed run config (a dict of sections), every value checked.

        Raises
        ------
        ConfigError
            No ``[run]`` section, or one of :meth:`RunSettings.from_section` and
            :meth:`FlowerSettings.from_section`'s refusals.
        """
        if "run" not in cfg:
            raise ConfigError("config needs a [run] section")
        return cls(RunSettings.from_section(cfg["run"]), FlowerSettings.from_section(cfg.get("flower")))
