"""From a sampler's settings to the Gaussian mechanisms of its rounds, and their (epsilon, delta).

**Why a round is a Gaussian mechanism.** The released draws of QLSD#, SGLD, FA-LD (one local
step) and DSGLD move as ``theta_{k+1} = F(theta_k) + gamma D_k + sigma Z_{k+1}`` with ``Z`` standard normal,
where only the aggregate ``D_k`` depends on the protected unit (a client, or one record), through
a contribution of norm at most ``B`` that is a function of ``theta_k``, the unit's data and the
round's fresh coins (minibatch, quantisation, participation). Given ``theta_k`` the round is then
the Gaussian mechanism with noise multiplier ``z = sigma / (gamma Delta)``, ``Delta`` the
sensitivity (``B`` when a unit is added or removed, ``2 B`` when it is replaced), and the run is
the adaptive composition of its rounds. (Randomness that the unit carries across rounds, if any,
is covered by conditioning on it: each conditional run is such a composition, and a mixture of
(epsilon, delta)-close pairs is (epsilon, delta)-close.) Subsampling amplifies when the unit
enters a round by a fresh coin: Poisson participation of clients, fixed-size minibatches of
records.

**Which draws are released does not change epsilon.** A run's rounds are accounted up to the
last round that is released, which is the run's last: thinned and burn-in draws hidden from the
user are still rounds whose output the later draws depend on. The released draws are a
post-processing of the whole trajectory, and standard composition bounds nothing smaller.
(Privacy amplification by iteration, Feldman et al. 2018, would need a contractive chain and
is not used.)

**Every released chain counts.** Each chain is an independent run of the mechanism on the same
data (its own noise, minibatches and participation), and the outputs release all of them, so a
run of ``chains`` chains of ``rounds`` rounds is the composition of ``rounds x chains``
mechanisms (:attr:`Setting.chains`).

**Against another client.** Poisson participation amplifies only while it is hidden. Under
secure aggregation every active client receives the round's active sets (it needs them to
derive its pairwise masks), so another client knows the rounds the protected client entered.
Given them, the client level is the Gaussian of ``z`` over those rounds without sampling; their
number is ``Binomial(rounds x chains, p)``, at most ``K``, its ``1 - delta / 2`` quantile, except
with probability ``delta / 2``, so the guarantee is the Gaussian of ``z`` over ``K`` rounds at
``delta / 2``, which makes ``(epsilon, delta)`` (:func:`against_clients`).

**The mappings**, one per mechanism (:data:`MECHANISMS`; a sampler's registry entry,
:attr:`fedmcmc.samplers.Registered.privacy`, names its own or the reason it is refused; ``C``
the bound on a client's decoded upload, :func:`fedmcmc.compression.clipped`, or on its grid
value on a fixed-point grid, :func:`fedmcmc.compression.resolve_clipped`; ``C_r`` the per-record
gradient bound, :func:`fedmcmc.models.clipped_gradients`; client ``i`` with ``N_i`` records,
minibatches of ``n_i``; ``w_i`` its weight in the server's sum):

* QLSD#: ``theta' = theta - gamma [grad U_0 + sum_{i in A} w_i m_i] + sqrt(2 gamma) Z``.
  Client level (add or remove client ``i``): ``||w_i m_i|| <= w_i C``, so
  ``z = sqrt(2 gamma) / (gamma w_i C) = sqrt(2 / gamma) / (w_i C)``; ``w_i = 1`` under full
  participation, ``w_i = 1 / p_i`` and Poisson rate ``p_i`` under Bernoulli participation with
  inverse-probability weights (the "active" scaling ``b / |A_k|`` depends on who else is active
  and is refused). Record level (replace one record): without compression, with ``C_r``,
  client ``i``'s upload ``(N_i / n_i) sum_{j in S} clip(g_j)`` changes by ``2 (N_i / n_i) C_r``
  when the record is in its minibatch (``n_i`` of ``N_i`` without replacement):
  ``z = sqrt(2 / gamma) n_i / (2 w_i N_i C_r)``; with ``C`` alone (or with compression, whose
  randomness a record-level clip does not control) the record changes only client ``i``'s
  upload, both within ``C``: ``z = sqrt(2 / gamma) / (2 w_i C)``, without sampling. The
  record level is the better of the two; participation is not used there (conservative).
* SGLD (pooled data, ``n`` of ``N``): the record level of QLSD# with one client, ``w = 1``.
  There is no client level: one party holds all the data.
* FA-LD with one local step per round (``T = 1``), full participation, no control variates:
  the average of the clients' moves is ``theta - (eta^2 / 2) [grad U_0 + sum_c H_c] + eta xi``
  with ``xi`` standard normal (the momenta ``sqrt(rho) xi + sqrt(1 - rho) xi^(c) / sqrt(w_c)``
  average to N(0, I)). Client level: the server adds ``w_c C_c(Delta_c)``, of norm at most
  ``w_c C``; the client's own momentum noise is inside its clipped message and the shared ``xi``
  is conditioned on (it is in that message too), so only the others' private momenta count:
  ``sigma^2 = eta^2 (1 - rho)(1 - w_c)`` and ``z = sigma / (w_c C)`` (the weights ``w_c`` are public
  settings; ``rho = 1`` leaves no noise). Record level without compression:
  ``Delta = eta^2 (N_c / n_c) C_r``, ``sigma = eta``, minibatch sampling as QLSD#.
* DSGLD (a chain visits shard ``s`` with probability ``f_s`` for ``L`` local steps; all of them are
  rounds): a local step is ``theta + (h / 2) [grad log p + (N_s / (f_s m)) sum_B clip(g_x)] +
  sqrt(h) Z``. Record level (replace one record, ``C_r``, minibatches of ``m`` without
  replacement): ``Delta = h N_s C_r / (f_s m)``, ``z = f_s m / (sqrt(h) N_s C_r)``, over
  ``rounds L`` steps. Client level, here *replacing* a shard's data (a shard is part of the
  chain's route, so it cannot be removed): ``Delta = h N_s C_r / f_s``,
  ``z = f_s / (sqrt(h) N_s C_r)``. The shard choice is not used to amplify (conservative).
* QLSD++ and LSD++ without memory (``memory = false`` or ``memory_rate = 0``): the server's
  memory sum ``eta`` stays 0, so a round is ``theta - gamma [grad U_0 + sum_{i in A} w_i Delta_i]
  + sqrt(2 gamma) Z`` with ``Delta_i`` client ``i``'s clipped message, ``||Delta_i|| <= C``. Its
  input ``H_i`` is the SVRG estimate at the anchor ``zeta``: a function of the client's data, of
  ``theta_k``, of ``zeta`` (an earlier ``theta``, a round the accountant counts as released; a
  client that missed a refresh catches up at the anchor the server sends) and of the round's
  fresh minibatch; the anchor gradient ``grad U_i(zeta)`` it keeps between rounds is a function
  of its data and ``zeta``. So, given the released trajectory, the round is QLSD#'s Gaussian
  mechanism with the same ``z = sqrt(2 / gamma) / (w_i C)`` at the client level (same
  participation rules). Record level: through ``C`` only (``z / 2``): the anchor term holds
  every record in every round, so the minibatch does not amplify and ``record_clip`` gives no
  bound of its own.
* Refused, with the reason its registry entry gives: QLSD*/LSD* (the mode and the server's
  constant are computed from the data without noise), QLSD++/LSD++ with memory (the memory
  ``eta_i = alpha sum_l Delta_i^l`` that the server adds every round carries all of a client's earlier messages, so a round's
  contribution ``eta_i + w_i Delta_i`` is not bounded by one message's clip), FA-HMC and FA-LD with ``T > 1`` (hidden
  local steps: the released average is not a Gaussian mechanism), CG-DSGLD (surrogates fitted
  without noise), DG-SGLD, pSGLD, FedAvg (not analysed here, or no noise).

Temperature is inside the clipped quantities: a tempered model's gradients are divided by
``T`` before they are clipped (wrap the tempered model), and the noise is the sampler's.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import numpy as np

from fedmcmc.privacy.accountant import GaussianRounds, epsilon

__all__ = ["Setting", "Bounds", "MECHANISMS", "LEVELS", "account", "against_clients", "knob", "level_epsilon",
           "mapping"]

LEVELS = ("client", "record")


class Setting(NamedTuple):
    """What the accountant needs to know of a run (client ``i`` in per-client arrays).

    Attributes
    ----------
    step_size
        ``gamma`` (QLSD#, SGLD) or ``eta`` (FA-LD), a constant.
    rounds
        Rounds of one chain (all of them: see the module docstring).
    clip, record_clip
        ``C`` (decoded upload) and ``C_r`` (one record's gradient), or None.
    counts, batch_sizes
        ``N_i`` and ``n_i`` (``batch_sizes`` None: full batches).
    probs, scaling
        Participation probabilities ``p_i`` and the weights' scheme: ``"full"``, ``"active"`` or
        ``"inverse_probability"``.
    compressed
        Whether uploads are compressed (not the identity).
    extra
        Sampler settings a mapping reads (FA-LD: ``weights``, ``correlation``, ``local_steps``,
        ``debiased``, ``step_decay``; DSGLD: ``probs``, ``local_steps``; QLSD++: ``memory``, ``memory_rate``).
    chains
        Chains released (each an independent run of ``rounds`` rounds on the same data): the
        mechanisms compose ``rounds x chains`` times.
    """

    step_size: float
    rounds: int
    clip: float | None
    record_clip: float | None
    counts: tuple
    batch_sizes: tuple | None
    probs: tuple
    scaling: str
    compressed: bool
    extra: dict = {}
    chains: int = 1


#: Per level, alternative bounds; each bound is one mechanism per group of units (clients differ),
#: or a string: why the level has no bound. A level's epsilon is min over bounds of max over groups.
Bounds = dict


def _batches(s: Setting) -> np.ndarray:
    counts = np.asarray(s.counts, np.int64)
    if s.batch_sizes is None:
        return counts
    return np.minimum(np.broadcast_to(np.asarray(s.batch_sizes, np.int64), counts.shape), counts)


def _composed(s: Setting) -> int:
    """The mechanisms one unit's data goes through: every round of every released chain."""
    return int(s.rounds) * int(s.chains)


def _records(s: Setting, weights, sigma_over_gamma: float) -> tuple:
    """Per client: replacing one record under per-record clipping and minibatches (no compression)."""
    n, counts = _batches(s), np.asarray(s.counts, np.int64)
    out = []
    for w, n_i, big_n in zip(np.broadcast_to(weights, counts.shape), n, counts):
        z = sigma_over_gamma / (2 * w * (big_n / n_i) * s.record_clip)
        out.append(GaussianRounds(z, _composed(s), "without_replacement", n_i / big_n, int(n_i), int(big_n)))
    return tuple(out)


def _record_bounds(s: Setting, weights, sigma_over_gamma: float, client_z=None) -> list:
    """The record level's bounds: per-record clipping (uncompressed uploads), and the client
    level's noise multipliers ``client_z`` halved (a replaced record moves one upload within ``C``)."""
    bounds = []
    if s.record_clip is not None and not s.compressed:
        bounds.append(_records(s, weights, sigma_over_gamma))
    if client_z is not None:
        bounds.append(tuple(GaussianRounds(z / 2, _composed(s)) for z in np.atleast_1d(client_z)))
    if not bounds:
        return ["no bound on one record's influence: set [privacy] record_clip (uncompressed uploads) or clip"]
    return bounds


def _no_clip(s: Setting) -> list | None:
    return None if s.clip is not None else ["no bound on a client's upload: set [privacy] clip"]


def _qlsd_sharp(s: Setting) -> Bounds:
    root = math.sqrt(2 / s.step_size)
    probs = np.broadcast_to(np.asarray(s.probs, float), (len(s.counts),))
    if s.scaling == "active" and np.any(probs < 1):
        why = ('participation scaling "active" weighs uploads by b / |A_k|, which every client changes; '
               'use participation = { p = ..., scaling = "inverse_probability" }')
        return {"client": [why], "record": [why]}
    weights = 1 / probs
    z = None if s.clip is None else root / (weights * s.clip)
    client = _no_clip(s) or [tuple(GaussianRounds(zi, _composed(s), "poisson", p) for zi, p in zip(z, probs))]
    return {"client": client, "record": _record_bounds(s, weights, root, z)}


def _sgld(s: Setting) -> Bounds:
    client = ["SGLD runs on the pooled data: one party holds every record, so there is no client to protect"]
    if s.clip is not None:
        return {"client": client, "record": ["SGLD uploads nothing: bound its records with [privacy] record_clip"]}
    return {"client": client, "record": _record_bounds(s, np.ones(1), math.sqrt(2 / s.step_size))}


def _fa_ld(s: Setting) -> Bounds:
    e = s.extra
    why = ("FA-LD is accounted with one local step per round (local_steps = 1)" if e.get("local_steps") != 1 else
           "SCAFFOLD's control variates (debiased) carry earlier rounds' gradients" if e.get("debiased") else
           "FA-LD is accounted at a constant step (step_decay changes its noise round by round)"
           if e.get("step_decay") is not None else
           "FA-LD is accounted under full participation" if s.scaling != "full" else None)
    if why:
        return {"client": [why], "record": [why]}
    w, rho, eta = np.asarray(e["weights"], float), float(e.get("correlation", 0.0)), s.step_size
    others = eta * np.sqrt((1 - rho) * (1 - w))  # the other clients' private momenta (the shared xi is conditioned on)
    z = None if s.clip is None else others / (w * s.clip)
    client = _no_clip(s) or [tuple(GaussianRounds(zi, _composed(s)) for zi in z)]
    # record level: the drift is (eta^2 / 2) sum_c H_c: gamma = eta^2 / 2, weight 1, sigma = eta
    return {"client": client, "record": _record_bounds(s, np.ones_like(w), eta / (eta**2 / 2), z)}


def _dsgld(s: Setting) -> Bounds:
    if s.record_clip is None:
        why = "DSGLD's draws are bounded through its records' gradients: set [privacy] record_clip"
        return {"client": [why], "record": [why]}
    f, n, counts = np.asarray(s.extra["probs"], float), _batches(s), np.asarray(s.counts, np.int64)
    steps, root_h = _composed(s) * int(s.extra["local_steps"]), math.sqrt(s.step_size)
    # a local step moves theta by (h / 2) (N_s / (f_s m)) sum_B clip(g_x) + sqrt(h) Z
    client = tuple(GaussianRounds(fs / (root_h * big * s.record_clip), steps) for fs, big in zip(f, counts))
    record = tuple(GaussianRounds(fs * m / (root_h * big * s.record_clip), steps, "without_replacement", m / big,
                                  int(m), int(big)) for fs, m, big in zip(f, n, counts))
    return {"client": [client], "record": [record]}


_STATE = ("its memory terms carry every earlier message of a client, which one message's clip does not bound; "
          "set [sampler] memory = false (QLSD++) or memory_rate = 0 (LSD++)")


def _qlsd_pp(s: Setting) -> Bounds:
    """QLSD++ / LSD++ without memory: QLSD#'s client level; the record level through ``C`` only."""
    rate = s.extra.get("memory_rate")
    if s.extra.get("memory", True) and not (rate is not None and np.all(np.asarray(rate, float) == 0)):
        return {"client": [_STATE], "record": [_STATE]}
    bounds = _qlsd_sharp(s._replace(record_clip=None))  # the anchor term holds every record: no minibatch bound
    if isinstance(bounds["record"][0], str) and s.clip is None:
        bounds["record"] = ["its SVRG anchor gradient holds every record in every round: bound records through "
                            "[privacy] clip"]
    return bounds

#: The Gaussian mechanisms of the module docstring, each under the algorithm it was derived for;
#: a registered sampler names the one that covers its rounds (:class:`fedmcmc.samplers.Accounted`).
MECHANISMS: dict[str, Callable[[Setting], Bounds]] = {
    "qlsd#": _qlsd_sharp, "sgld": _sgld, "fa-ld": _fa_ld, "dsgld": _dsgld, "qlsd++": _qlsd_pp,
}


def mapping(name: str) -> Callable[[Setting], Bounds]:
    """The mapping of registered sampler ``name``: its entry's mechanism, or, for an entry whose
    :attr:`fedmcmc.samplers.Registered.privacy` is a reason, both levels refused with it."""
    from fedmcmc.samplers import REGISTRY

    if name not in REGISTRY:
        raise ValueError(f"no privacy mapping for sampler {name!r}: it is not registered; registered: "
                         f"{', '.join(REGISTRY)}")
    declared = REGISTRY[name].privacy
    if isinstance(declared, str):
        return lambda s: {"client": [declared], "record": [declared]}
    return MECHANISMS[declared.mechanism]


def knob(name: str, level: str) -> str:
    """The :class:`Setting` field a budget at ``level`` chooses for sampler ``name``: ``clip`` for
    clients and ``record_clip`` for records, unless its :class:`fedmcmc.samplers.Accounted` says otherwise."""
    from fedmcmc.samplers import REGISTRY

    declared = REGISTRY[name].privacy
    knobs = {} if isinstance(declared, str) else declared.knobs
    return knobs.get(level, "clip" if level == "client" else "record_clip")


def level_epsilon(bounds, delta: float, accountant: str = "rdp") -> float:
    """A level's epsilon: the best bound's worst group (raises ValueError with the reason if none)."""
    if isinstance(bounds[0], str):
        raise ValueError(bounds[0])
    return min(max(epsilon(m, delta, accountant) for m in set(groups)) for groups in bounds)


def against_clients(name: str, setting: Setting, delta: float, accountant: str = "rdp") -> dict:
    """The client level against a party that sees who takes part in every round (another client
    under secure aggregation; the module docstring): ``{"epsilon", "delta", "rounds_entered"}``,
    ``rounds_entered`` the most rounds a client enters but with probability ``delta / 2`` (all of
    them without Poisson participation: then the client level itself), or ``{"refused": reason}``.
    """
    from scipy.stats import binom

    bounds = mapping(name)(setting)["client"]
    if isinstance(bounds[0], str):
        return {"refused": bounds[0]}
    if not any(m.sampling == "poisson" and m.rate < 1 for groups in bounds for m in groups):
        return {**account(name, setting, delta, accountant)["client"], "rounds_entered": _composed(setting)}

    def seen(m: GaussianRounds) -> GaussianRounds:
        if m.sampling != "poisson":
            return m
        return GaussianRounds(m.noise_multiplier, int(binom.isf(delta / 2, m.rounds, m.rate)))
    bounds = [tuple(seen(m) for m in groups) for groups in bounds]
    entered = max(m.rounds for groups in bounds for m in groups)
    return {"epsilon": level_epsilon(bounds, delta / 2, accountant), "delta": delta, "rounds_entered": entered}


def account(name: str, setting: Setting, delta: float, accountant: str = "rdp") -> dict:
    """Client- and record-level ``{"epsilon", "delta"}`` of a run of the registered sampler
    ``name``, or ``{"refused": reason}`` for a level without a bound."""
    bounds = mapping(name)(setting)
    out = {}
    for level in LEVELS:
        try:
            out[level] = {"epsilon": level_epsilon(bounds[level], delta, accountant), "delta": delta}
        except ValueError as err:
            out[level] = {"refused": str(err)}
    return out
