"""``[privacy]`` in a run config: clipping, the (epsilon, delta) a run meets, and budgets.

::

    [privacy]
    delta = 1e-5          # required
    epsilon = 2.0         # a budget (optional): the run meets it at `level`, or is refused
    level = "client"      # or "record": the unit the budget protects
    clip = 50.0           # C, a client's decoded upload norm (fedmcmc.compression.clipped)
    record_clip = 5.0     # C_r, one record's gradient norm (fedmcmc.models.clipped_gradients)
    accountant = "rdp"    # or "pld"
    release = "all"       # or "draws": write only what the (epsilon, delta) covers
    publish_seed = false  # true: write [run] seed into the outputs (listed as not covered)

With a budget and no bound for its level (``clip`` for clients, ``record_clip`` for records),
the largest bound that meets the budget is chosen; with a bound that misses the budget the run
is refused, naming the bound and the number of rounds that would meet it. The run's results
record ``privacy``: the bounds, the rounds, the chains (every released chain is composed: the
accountant counts ``rounds x chains`` mechanisms) and both levels' (epsilon, delta), or why a level
has none (:func:`fedmcmc.privacy.account`); under ``[flower] secure_aggregation`` also
``another_client``, the client level against a client that sees the active sets
(:func:`fedmcmc.privacy.mechanisms.against_clients`); and ``not_covered``: what the outputs hold that the
(epsilon, delta) does not cover. ``release = "draws"`` strips those from the outputs
(:func:`released`; ``posterior.nc`` keeps its ``posterior`` group alone) and refuses a run whose
draws themselves depend on the data without noise (an "auto" step, standardised ``[data]``).
"""

from __future__ import annotations

import math

import numpy as np

from fedmcmc.compression import resolve_clipped
from fedmcmc.core import checks
from fedmcmc.models import clipped_gradients
from fedmcmc.runtime.settings import Settings

# fedmcmc.privacy (dp-accounting, scipy.signal: seconds of imports) is imported by the functions that
# account, so that a run without [privacy] and a Flower node do not pay for it

__all__ = ["KEYS", "RELEASES", "settle", "attrs", "draws_only", "released"]

#: Released quantities that depend on the data and that the accountant does not cover (docs/privacy.md).
_UNCOVERED = ["sample_stats bits_up, bits_down and active_clients", "the bits and participation in results.json and "
              "summary.json", "the held-out points (log_likelihood, observed_data, predictive metrics, "
              "reliability.png)", "each client's counts (inputs.clients)", "the data's scaling and split",
              "the Laplace approximation at the mode (results.json laplace) and the posterior check against it "
              "(posterior_check, posterior_check_passed, exit code 4)", "the mode search's rounds and bits "
              "(theta_star)", "a [problem] run's errors against its exact posterior", "timings and a Flower run's counts",
              "what the server sees of each upload"]
#: The seed's entry of ``not_covered``: the outputs carry it (publish_seed = true), it is the public default, or
#: it is secret and only the run folder's own files hold it.
_SEED = {"published": "the seed: [privacy] publish_seed = true writes [run] seed into results.json, summary.json and "
                      "posterior.nc, and whoever holds it can subtract the noise",
         "default": "the seed: [run] seed is not set and the default, 0, is public, so anyone can subtract the "
                    "noise; set a secret [run] seed",
         "secret": "the run folder's config.toml and chunks/ (the checkpoint): they hold [run] seed, and whoever "
                   "holds it can subtract the noise; keep them private"}
#: What release = "draws" still writes that the accountant does not cover (what it cannot strip is refused).
_DRAWS_UNCOVERED = ["the seed: 32 bits (JAX's PRNGKey) of a secret; the run folder's config.toml and chunks/ "
                    "(the checkpoint) hold it and everything else: keep them private",
                    "the data's schema (feature names; the task and the classes where [data] does not declare them)",
                    "floating-point rounding of the noise and the sums (the mechanisms are analysed over the reals)",
                    "what the server sees of each upload (secure_aggregation: only their sum)"]
#: Keys of results.json and summary.json (and of their settings and inputs) that release = "draws" writes:
#: the settings, the (epsilon, delta) and functions of the draws alone.
_RELEASED = {"config", "sampler", "num_draws", "diagnostics", "step", "privacy", "inputs", "num_chains",
             "num_stored_draws", "stored_every", "warnings", "convergence", "step_size", "settings", "task", "num_classes",
             "feature_names", "class_names", "scaling", "input_shape"}
RELEASES = ("all", "draws")
KEYS = {"epsilon", "delta", "level", "clip", "record_clip", "accountant", "release", "publish_seed"}


def _positive(section: dict, key: str, error) -> float | None:
    try:
        return None if section.get(key) is None else checks.positive(f"[privacy] {key}", section[key])
    except ValueError as err:
        raise error(str(err)) from None


def _checked(section: dict, error) -> dict:
    from fedmcmc.privacy import ACCOUNTANTS, LEVELS
    p = {key: _positive(section, key, error) for key in ("epsilon", "delta", "clip", "record_clip")}
    if p["delta"] is None or not p["delta"] < 1:
        raise error("[privacy] needs delta in (0, 1), e.g. delta = 1e-5 (well below 1 / number of units)")
    p["level"], p["accountant"] = section.get("level", "client"), section.get("accountant", "rdp")
    if p["level"] not in LEVELS:
        raise error(f"[privacy] level must be one of {LEVELS} (got {p['level']!r})")
    if p["accountant"] not in ACCOUNTANTS:
        raise error(f"[privacy] accountant must be one of {ACCOUNTANTS} (got {p['accountant']!r})")
    p["release"] = section.get("release", "all")
    if p["release"] not in RELEASES:
        raise error(f"[privacy] release must be one of {RELEASES} (got {p['release']!r})")
    p["publish_seed"] = section.get("publish_seed", False)
    if not isinstance(p["publish_seed"], bool):
        raise error(f"[privacy] publish_seed must be true or false (got {p['publish_seed']!r})")
    if p["publish_seed"] and p["release"] == "draws":
        raise error('[privacy] publish_seed = true contradicts release = "draws" (the seed reveals the noise); '
                    "drop one of them")
    return p


def _draws_only(cfg: dict, error) -> None:
    """Refuse release = "draws" for a run whose draws depend on the data without noise, or whose
    noise is public (the default seed)."""
    if "seed" not in cfg["run"]:
        raise error('[privacy] release = "draws" needs a secret [run] seed: the noise is drawn from it (the default, '
                    "0, is public); it is left out of the outputs")
    if cfg["sampler"].get("step_size") == "auto":
        raise error('[privacy] release = "draws" needs a numeric [sampler] step_size: "auto" reads the curvature '
                    "at the mode, computed from the data without noise")
    if "data" in cfg and cfg["data"].get("standardise", True):
        raise error('[privacy] release = "draws" needs [data] standardise = false: the scaling is computed from '
                    "the data without noise (scale the inputs with public constants beforehand)")


def _setting(name: str, args: dict, data, pooled: bool, rounds: int, chains: int, p: dict):
    from fedmcmc.privacy import Setting
    scheme = args.get("participation")
    probs = 1.0 if scheme is None else scheme.probs
    scaling = ("full" if scheme is None or scheme.name == "full" else
               "active" if scheme.pause_when_empty else "inverse_probability")
    counts = np.asarray(data.counts, int)
    batch = args.get("batch_size")
    compressor = args.get("compressor")
    step = np.asarray(args.get("step_size", args.get("learning_rate", np.nan)), float)
    return Setting(float(np.max(step)), int(rounds), p["clip"], p["record_clip"],
                   (int(counts.sum()),) if pooled else tuple(counts.tolist()),
                   None if batch is None else tuple(np.atleast_1d(batch).tolist()),
                   tuple(np.atleast_1d(probs).tolist()), scaling,
                   compressor is not None and compressor.name != "identity",
                   {key: args[key] for key in ("weights", "correlation", "local_steps", "debiased", "step_decay", "probs",
                                               "memory", "memory_rate")
                    if key in args},  # a key not set keeps the builder's default, the mapping's too
                   int(chains))


def _largest(ok, low: float, high: float, integer: bool = False, rtol: float = 1e-4):
    """The largest value in ``[low, high]`` with ``ok`` (monotone: true below, false above), to a
    relative ``rtol`` (exact for integers), or None."""
    if not ok(low):
        return None
    if ok(high):
        return high
    while high > low * (1 + rtol):
        mid = (low + high) // 2 if integer else math.sqrt(low * high)
        if mid in (low, high):
            break
        low, high = (mid, high) if ok(mid) else (low, mid)
    return low


def _meets(name: str, s, p: dict):
    from fedmcmc.privacy.mechanisms import level_epsilon, mapping

    def ok(setting) -> bool:
        bounds = mapping(name)(setting)[p["level"]]
        return level_epsilon(bounds, p["delta"], p["accountant"]) <= p["epsilon"]
    return ok


def _budget(name: str, s, p: dict, error):
    """The setting that meets the budget: the level's bound chosen if it is not set, else checked."""
    from fedmcmc.privacy.mechanisms import account, knob as knob_of, mapping
    level = p["level"]
    knob, ok = knob_of(name, level), _meets(name, s, p)
    if getattr(s, knob) is None:
        try:
            if ok(s):  # met by the level's other bound (a replaced record moves one clipped upload)
                return s
        except ValueError:
            pass
        probe = mapping(name)(s._replace(**{knob: 1.0}))[level]
        if isinstance(probe[0], str):
            raise error(f"[privacy] epsilon for {name} at level {level!r}: {probe[0]}")
        bound = _largest(lambda c: ok(s._replace(**{knob: c})), 1e-6, 1e6)
        if bound is None:
            raise error(f"[privacy] epsilon = {p['epsilon']:g} cannot be met by any {knob} for {name}; "
                        "raise epsilon or lower [run] num_iterations")
        return s._replace(**{knob: bound})
    try:
        if ok(s):
            return s
    except ValueError as err:
        raise error(f"[privacy] epsilon for {name} at level {level!r}: {err}") from None
    bound = _largest(lambda c: ok(s._replace(**{knob: c})), 1e-6, getattr(s, knob))
    rounds = _largest(lambda t: ok(s._replace(rounds=t)), 1, s.rounds, integer=True)
    chains = _largest(lambda c: ok(s._replace(chains=c)), 1, s.chains, integer=True) if s.chains > 1 else None
    fixes = [f"[privacy] {knob} <= {bound:.4g}" if bound else None,
             f"[run] num_iterations <= {rounds}" if rounds else None,
             f"[run] num_chains <= {chains}" if chains else None]
    eps = account(name, s, p["delta"], p["accountant"])[level]["epsilon"]
    fix = " or ".join(f for f in fixes if f) or "raise epsilon (no bound or number of rounds meets it)"
    raise error(f"[privacy] the run's {level}-level epsilon is {eps:.4g} > epsilon = {p['epsilon']:g}; set {fix}")


def settle(cfg: dict, name: str, args: dict, data, pooled: bool, error=ValueError,
           settings: Settings | None = None) -> tuple[dict, dict | None]:
    """Apply ``cfg``'s ``[privacy]`` to a run's builder arguments: choose or check the bounds
    against the budget, clip the model's record gradients (``record_clip``) and the uploads
    (``clip``), and account the run (its rounds, chains and secure aggregation from ``settings``,
    the config's typed settings, else read from ``cfg``; whether ``[run] seed`` is given at all,
    from ``cfg``). Returns the arguments and the record for its results (None without
    ``[privacy]``); ``error`` is raised with one line naming the problem and the fix."""
    if "privacy" not in cfg:
        return args, None
    settings = settings or Settings.from_config(cfg)
    from fedmcmc.privacy import account
    from fedmcmc.privacy.mechanisms import against_clients
    p = _checked(cfg["privacy"], error)
    s = _setting(name, args, data, pooled, settings.run.num_iterations, settings.run.num_chains, p)
    if p["epsilon"] is not None:
        s = _budget(name, s, p, error)
    args = dict(args)
    if s.record_clip is not None:
        args["model"] = clipped_gradients(args["model"], s.record_clip)
    if s.clip is not None and "compressor" in args:
        try:  # on a fixed_point grid, inside it: the bound holds for the grid values the server sums
            args["compressor"] = resolve_clipped(cfg["sampler"].get("compression"), s.clip, args["model"].dim,
                                                 data.num_clients)
        except ValueError as err:
            raise error(f"[privacy] clip: {err}") from None
    levels = account(name, s, p["delta"], p["accountant"])
    if settings.flower.secure_aggregation:  # every active client sees the active sets
        levels["another_client"] = against_clients(name, s, p["delta"], p["accountant"])
    if p["release"] == "draws":
        _draws_only(cfg, error)
        uncovered = _DRAWS_UNCOVERED
    else:
        seed = "published" if p["publish_seed"] else "default" if "seed" not in cfg["run"] else "secret"
        uncovered = [_SEED[seed]] + _UNCOVERED + (
            ["step_size = \"auto\" (the curvature at the mode)"] if cfg["sampler"].get("step_size") == "auto" else [])
    budget = None if p["epsilon"] is None else {"epsilon": p["epsilon"], "level": p["level"]}
    return args, {"clip": s.clip, "record_clip": s.record_clip, "rounds": s.rounds, "chains": s.chains,
                  "accountant": p["accountant"],
                  "budget": budget, **levels, "release": p["release"], "publish_seed": p["publish_seed"],
                  "not_covered": uncovered}


def attrs(record: dict | None) -> dict:
    """``{"privacy": record}`` for a run's settings, nothing without ``[privacy]``."""
    return {} if record is None else {"privacy": record}


def draws_only(record: dict | None) -> bool:
    """Whether the run's outputs are to hold only what the accountant covers (``release = "draws"``)."""
    return record is not None and record.get("release") == "draws"


def _seedless(payload: dict) -> dict:
    """``payload`` with its config (its own, or its ``settings``') without ``[run] seed``."""
    out = {key: _seedless(value) if key == "settings" and isinstance(value, dict) else value
           for key, value in payload.items()}
    if isinstance(out.get("config"), dict) and "run" in out["config"]:  # the noise is drawn from the seed: secret
        out["config"] = {**out["config"], "run": {k: v for k, v in out["config"]["run"].items() if k != "seed"}}
    return out


def released(record: dict | None, payload: dict) -> dict:
    """``payload`` (results.json, summary.json, posterior.nc's attributes) as written: under
    ``[privacy]`` the config without ``[run] seed`` (the noise is drawn from it) unless
    ``publish_seed = true``; whole otherwise, or under ``release = "draws"`` only the keys of
    ``_RELEASED`` (the settings, the (epsilon, delta) and functions of the draws), in its
    ``settings`` and ``inputs`` too (whose ``clients``, the counts, become ``[]``)."""
    if record is None:
        return payload
    if not draws_only(record):
        return payload if record.get("publish_seed") else _seedless(payload)
    out = {key: released(record, value) if key in ("settings", "inputs") and isinstance(value, dict) else value
           for key, value in payload.items() if key in _RELEASED}
    out = _seedless(out)
    return {**out, "clients": []} if "clients" in payload else out  # inputs: the counts out, the fields kept
