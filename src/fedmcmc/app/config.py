"""`fedmcmc run CONFIG.toml`: a run described in a TOML file, validated before it starts.

A run has either ``[problem]`` (a built-in problem with an exact posterior, below) or ``[data]``
and ``[model]`` (a practitioner's data and model: :mod:`fedmcmc.app.inputs`), plus ``[sampler]``
and ``[run]``. Relative file paths are relative to the config file's folder. Example::

    [problem]
    name = "heterogeneous-gaussian"   # a problem of fedmcmc.app.problems.PROBLEMS
    num_clients = 20
    dim = 50

    [sampler]
    name = "qlsd*"                    # a sampler of fedmcmc.samplers.REGISTRY
    step_size = 4.9e-4                # or "auto": from the curvature at the mode (fedmcmc.app.auto_step)
    batch_fraction = 0.1              # or batch_size = 10 (per client), omit for full batches
    compression = { bits = 8 }        # or { levels = 16 }, "none"
    participation = { p = 0.5, scaling = "inverse_probability" }

    [run]
    seed = 0
    num_chains = 4
    num_iterations = 20000            # burn_in = 10000, thinning = 10 and chunk_size are optional
                                      # devices = 2: local GPUs to spread the chains over (default all)
                                      # max_stored_draws = 2000: draws per chain in posterior.nc,
                                      # thinned evenly (the default; 0: all)
                                      # init, posterior_check: fedmcmc.app.posterior
                                      # whiten = "auto" | true | false: the sampler in coordinates
                                      # theta = theta* + L z, L L^T = H^-1 (fedmcmc.app.whiten;
                                      # "auto", the default, with step_size = "auto")

Both sections are registries. A ``[problem]`` may set its builder's keyword arguments
(:func:`fedmcmc.app.problems.settings`). A ``[sampler]`` may set its builder's arguments
(:func:`sampler_keys`; ``fedmcmc list`` prints them) and must set those without a default,
except the arguments of :data:`_ARGUMENTS`, which the run supplies (``model``, ``weights``,
the mode of QLSD*) or makes from other keys (``compression`` is the ``compressor``,
``participation`` the scheme, ``batch_fraction`` a ``batch_size``, ``shard_probs`` the
``probs``, ``surrogate`` and ``surrogate_*`` the CG-DSGLD surrogate), and those its registry
entry fixes (:attr:`fedmcmc.samplers.Registered.fixed`); it must also set the keys of
:attr:`~fedmcmc.samplers.Registered.must_set`, which name why.

``[run]`` and ``[flower]`` are typed settings (:class:`fedmcmc.runtime.settings.RunSettings`,
:class:`~fedmcmc.runtime.settings.FlowerSettings`): :func:`validate` checks every value of both
and returns them, and the built run carries them (:attr:`Built.settings`) to the simulator and
to the Flower server and clients.
"""

from __future__ import annotations

import inspect
import sys
import time
import tomllib
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from fedmcmc.estimators import gradients, surrogates
from fedmcmc.app import inputs, privacy, problems
from fedmcmc.app.inputs import model_from_config
from fedmcmc.compression import resolve_compressor
from fedmcmc.runtime.settings import ConfigError, FlowerSettings, RunSettings, Settings
from fedmcmc.samplers import ALIASES, REGISTRY
from fedmcmc.samplers.participation import resolve_participation

#: Optional sections: the Flower runtime's (docs/flower.md; checked, not used, by ``fedmcmc run``), privacy (app/privacy.py).
_OPTIONAL = {"flower": set(FlowerSettings.keys()), "privacy": privacy.KEYS}


class Built(NamedTuple):
    """A config turned into a run.

    Attributes
    ----------
    data, model, exact
        The clients' training data (pooled into one client for a pooled sampler), the model
        (``[problem]``'s, or ``[model]`` built for the data), a ``[problem]``'s exact posterior (or None).
    sampler, mode
        The registered sampler built from ``[sampler]`` (on the whitened model when ``whitening``
        is used: it moves ``z``); the federated mode the run found in ``theta`` (for QLSD*'s control
        variates, ``step_size = "auto"`` or the whitening), else None.
    tests, inputs
        Each client's held-out ``(x, y)``, or None (a ``[problem]``, or ``test_fraction = 0``); what
        the data were (:class:`fedmcmc.app.inputs.Inputs`), None for a ``[problem]``.
    step, privacy
        How the step size was set: ``{"value": ..., "rule": "given"}``, or with ``step_size = "auto"``
        the record of :func:`fedmcmc.app.auto_step.auto_step` (value, rule, curvature, rounds, bits); with
        ``[privacy]``, the bounds and the (epsilon, delta) the run meets (:func:`fedmcmc.app.privacy.settle`).
    laplace, start
        ``(approximation or None, record)`` of :func:`fedmcmc.app.posterior.laplace` and the chains'
        starting points ``[num_chains, d]`` in the sampler's coordinates (``z`` when whitened), set
        by :func:`with_start` where the run is driven (the simulator, a Flower server); until then
        None, or the approximation made for the whitening (:func:`fedmcmc.app.posterior.approximate`).
    whitening
        ``(Whitening or None, record)``, set by :func:`build_run`: the map ``theta = theta* + L z``
        the sampler runs in (:mod:`fedmcmc.app.whiten`), None when it runs in ``theta``, and
        ``results.json``'s ``whitening`` (its cost, or why it is not used).
    settings
        The config's typed ``[run]`` and ``[flower]`` settings (:class:`fedmcmc.runtime.settings.Settings`),
        what the simulator path and the Flower server and clients read.
    federation
        The clients as the estimators reach them (:mod:`fedmcmc.estimators.federation`): the
        simulator's :class:`~fedmcmc.estimators.federation.Local`, or a Flower server's nodes.
    """

    data: Any
    model: Any
    exact: Any
    sampler: Any
    mode: Any
    tests: tuple | None
    inputs: inputs.Inputs | None
    step: dict
    privacy: dict | None = None
    laplace: tuple | None = None
    start: np.ndarray | None = None
    whitening: tuple | None = None
    settings: Settings | None = None
    federation: Any = None


class _Run(NamedTuple):
    """What the sampler arguments are made from: the problem, the sampler's name and the mode if known."""
    name: str
    data: Any
    model: Any
    mode: Any = None
    federation: Any = None


class _Argument(NamedTuple):
    """A builder argument that is not the ``[sampler]`` key of its name: made by
    ``make(section, run)`` from the section's ``keys`` (none: the run supplies it)."""
    keys: tuple[str, ...]
    make: Callable[[dict, _Run], Any]


def _batch_size(s: dict, run: _Run):
    if "batch_size" in s and "batch_fraction" in s:
        raise ConfigError("give batch_size or batch_fraction, not both")
    batch, fraction = s.get("batch_size"), s.get("batch_fraction")
    if fraction is not None:
        if isinstance(fraction, bool) or not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ConfigError(f"batch_fraction must lie in (0, 1] (got {fraction!r})")
        batch = np.maximum((np.asarray(run.data.counts) * fraction).astype(int), 1)
    if REGISTRY[run.name].pooled and batch is not None and np.size(batch) > 1:
        batch = int(np.sum(batch))  # the pooled data's batch: the clients' batches together
    return batch


def _shard_probs(s: dict, run: _Run):
    probs = s.get("shard_probs", "uniform")
    if probs not in ("uniform", "size"):
        raise ConfigError('shard_probs must be "uniform" (f_s = 1/S) or "size" (f_s = N_s / N)')
    b = run.data.num_clients
    return run.data.weights if probs == "size" else np.full(b, 1 / b)


#: ``surrogate = KIND`` -> the fitter of :mod:`fedmcmc.estimators.surrogates`, from the section.
_SURROGATES = {
    "taylor": lambda s, cov: surrogates.taylor(cov),
    "laplace": lambda s, cov: surrogates.laplace(cov),
    "sgld": lambda s, cov: surrogates.sgld_moments(s["surrogate_step_size"], s.get("surrogate_steps", 5000),
                                                   s.get("surrogate_burn_in", 1000), cov),
}


def _surrogate(s: dict, run: _Run):
    kind = s.get("surrogate", "taylor")
    if kind not in _SURROGATES:
        raise ConfigError(f"unknown surrogate {kind!r}; choose one of {tuple(_SURROGATES)}")
    if kind == "sgld" and "surrogate_step_size" not in s:
        raise ConfigError('surrogate = "sgld" needs surrogate_step_size, the local Langevin step (a number, or "auto" '
                          'with step_size = "auto")')
    if s.get("surrogate_step_size") == "auto":
        return None  # set with the step, from the same curvature (build_run, Registered.auto_keys)
    return _SURROGATES[kind](s, s.get("surrogate_covariance", "full"))


#: The builder arguments a ``[sampler]`` key does not give as is (see the module docstring).
_ARGUMENTS = {
    "model": _Argument((), lambda s, run: run.model),
    "weights": _Argument((), lambda s, run: run.data.weights),
    "num_clients": _Argument((), lambda s, run: run.data.num_clients),
    "mode": _Argument((), lambda s, run: gradients.find_mode(run.model, run.federation) if run.mode is None else run.mode),
    "name": _Argument((), lambda s, run: run.name),
    "batch_size": _Argument(("batch_size", "batch_fraction"), _batch_size),
    "compressor": _Argument(("compression",), lambda s, run: resolve_compressor(s.get("compression"),
                                                                                       run.data.num_clients)),
    "participation": _Argument(("participation",), lambda s, run: resolve_participation(s.get("participation"))),
    "probs": _Argument(("shard_probs",), _shard_probs),
    "surrogate": _Argument(("surrogate", "surrogate_covariance", "surrogate_step_size", "surrogate_steps",
                            "surrogate_burn_in"), _surrogate),
    "anchor": _Argument((), lambda s, run: None),  # the mode, set by build_run when the run has it
}
#: Builder arguments under another key: FedAvg's learning rate is the step size.
_RENAMED = {"learning_rate": "step_size"}


def _parameters(name: str) -> dict[str, inspect.Parameter]:
    """The builder's parameters that a config sets, under their builder names (all but the
    registry entry's :attr:`~fedmcmc.samplers.Registered.fixed`)."""
    fixed = REGISTRY[name].fixed
    return {p: v for p, v in inspect.signature(REGISTRY[name].build).parameters.items() if p not in fixed}


def sampler_keys(name: str) -> dict[str, bool]:
    """The keys a ``[sampler]`` section of this registered sampler may set (besides ``name``),
    each with whether it must be set."""
    keys = {}
    for param, p in _parameters(name).items():
        if param in _ARGUMENTS:
            keys.update(dict.fromkeys(_ARGUMENTS[param].keys, False))
        else:
            keys[_RENAMED.get(param, param)] = p.default is inspect.Parameter.empty
    return {**keys, **dict.fromkeys(REGISTRY[name].must_set, True)}


def example(name: str, **keys) -> dict:
    """The run config of registered sampler ``name``'s example run (validated): its registry
    entry's :attr:`~fedmcmc.samplers.Registered.example` as ``[sampler]`` with ``keys`` added, on
    its :attr:`~fedmcmc.samplers.Registered.problem`, one chain of one round. What the tests'
    catalogue and the chain-scaling bench build (:func:`build`, or :func:`build_run` on other data)."""
    entry = REGISTRY[name]
    cfg = {"problem": dict(entry.problem), "sampler": {"name": name, **entry.example, **keys},
           "run": {"num_chains": 1, "num_iterations": 1}}
    validate(cfg)
    return cfg


def sampler_name(cfg: dict) -> str:
    """The registered name of the config's sampler (aliases resolved)."""
    given = cfg["sampler"].get("name")
    name = str(given).lower()
    name = ALIASES.get(name, name)
    if name not in REGISTRY:
        raise ConfigError(f"unknown sampler {given!r}; available: {', '.join(REGISTRY)} (aliases: "
                          f"{', '.join(ALIASES)})")
    return name


def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found; give the path to a TOML file")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None


def load(path: str | Path) -> dict:
    """The run config of a TOML file, parsed and checked (:func:`validate`)."""
    cfg = _read(Path(path))
    validate(cfg)
    return cfg


def _unknown(section: str, given, allowed) -> None:
    unknown = set(given) - set(allowed)
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{section}]; allowed: {sorted(allowed)}")


def validate(cfg: dict) -> Settings:
    """Check a parsed config's sections and keys, and the values of ``[run]`` and ``[flower]``:
    returns their typed settings (:meth:`fedmcmc.runtime.settings.Settings.from_config`; the other
    sections' values are checked as the run is built)."""
    for section in ("sampler", "run"):
        if section not in cfg:
            raise ConfigError(f"config needs a [{section}] section")
    extra = set(cfg) - {"problem", "data", "model", "sampler", "run"} - set(_OPTIONAL)
    if extra:
        raise ConfigError(f"unknown section(s) {sorted(extra)}; allowed: "
                          f"{['data', 'model', 'problem', 'run', 'sampler', *_OPTIONAL]}")
    if ("problem" in cfg) == ("data" in cfg or "model" in cfg) or ("data" in cfg) != ("model" in cfg):
        raise ConfigError("a config needs either [problem] (a built-in problem) or both [data] and [model] "
                          f"(your data and model); it has {sorted({'problem', 'data', 'model'} & set(cfg))}")
    _unknown("run", cfg["run"], RunSettings.keys())
    for section, keys in _OPTIONAL.items():
        _unknown(section, cfg.get(section, {}), keys)
    if "data" in cfg:
        _unknown("data", cfg["data"], inputs.DATA_KEYS)
        if cfg["model"].get("name") in inputs.MODELS:  # a user's function is imported as the run is built
            inputs.resolve_builder(cfg["model"])
    else:
        _validate_problem(cfg)
    _validate_sampler(cfg)
    return Settings.from_config(cfg)


def _validate_problem(cfg: dict) -> None:
    name = cfg["problem"].get("name")
    if name not in problems.PROBLEMS:
        raise ConfigError(f"unknown problem {name!r}; available: {', '.join(problems.PROBLEMS)}")
    unknown = set(cfg["problem"]) - {"name"} - set(problems.settings(name))
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} for problem {name!r}; allowed: "
                          f"{sorted({'name', *problems.settings(name)})}")


def _validate_sampler(cfg: dict) -> None:
    name, section = sampler_name(cfg), cfg["sampler"]
    keys = sampler_keys(name)
    extra = sorted(set(section) - {"name"} - set(keys))
    if extra:
        owners = [other for other in REGISTRY if set(extra) <= set(sampler_keys(other))]
        owners = owners or [other for other in REGISTRY if set(extra) & set(sampler_keys(other))]
        whose = f" (settings of {', '.join(owners)})" if owners else ""
        raise ConfigError(f"{name} does not take {extra}{whose}; drop them or choose a sampler that takes them; "
                          f"{name} takes {sorted(keys)}")
    missing = sorted(key for key, required in keys.items() if required and key not in section)
    if missing:
        why = [REGISTRY[name].must_set.get(key) for key in missing]
        raise ConfigError(f"[sampler] {name} needs {', '.join(missing)}"
                          + "".join(f"; {text}" for text in why if text))
    if isinstance(section.get("step_size"), str) and section["step_size"] != "auto":
        raise ConfigError(f'[sampler] step_size must be a positive number or "auto" (got {section["step_size"]!r})')
    for key in REGISTRY[name].auto_keys:
        if isinstance(section.get(key), str) and (section[key] != "auto" or section.get("step_size") != "auto"):
            raise ConfigError(f'[sampler] {key} must be a positive number, or "auto" with step_size = "auto" (got '
                              f'{section[key]!r})')
    for param, p in _parameters(name).items():
        key = _RENAMED.get(param, param)
        if isinstance(p.default, bool) and key in section and not isinstance(section[key], bool):
            raise ConfigError(f"[sampler] {key} must be true or false (got {section[key]!r})")


def from_text(text: str, base_dir: str | Path | None = None, start: bool = False) -> tuple[dict, Built]:
    """A run config given as TOML text, checked and built: ``(cfg, built)``; relative paths start at
    ``base_dir`` (default: the working directory). Flower builds a ``[problem]`` run with it: its
    clients as it is, its server with the chains' starting points and the posterior check's
    approximation (``start``, :func:`with_start`)."""
    cfg = tomllib.loads(text)
    built = build(cfg, base_dir, validate(cfg))
    return cfg, with_start(cfg, built) if start else built


def _problem(cfg: dict) -> problems.Problem:
    p = dict(cfg["problem"])
    problem = p.pop("name")
    for key, value in p.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"[problem] {key} must be a non-negative number (got {value!r})")
    if p.get("min_size", 10) >= p.get("max_size", 200) or p.get("num_clients", 20) < 1 or p.get("dim", 50) < 1:
        raise ConfigError("[problem] needs num_clients >= 1, dim >= 1 and min_size < max_size")
    return problems.PROBLEMS[problem](**p)


def build(cfg: dict, base_dir: str | Path | None = None, settings: Settings | None = None) -> Built:
    """A validated config's data and model (relative ``[data]`` paths start at ``base_dir``,
    default: the working directory), made into a run by :func:`build_run` (with ``settings``, what
    :func:`validate` returned, if given)."""
    if "problem" in cfg:
        (data, model, exact), tests, info = _problem(cfg), None, None
    else:
        data, tests, info = inputs.load_data(cfg["data"], base_dir)
        model, exact = model_from_config(cfg, info, base_dir), None
    return build_run(cfg, data, model, exact, tests, info, settings=settings)


def build_run(cfg: dict, data, model, exact=None, tests=None, info=None, mode=None,
              settings: Settings | None = None, federation=None, known: dict | None = None) -> Built:
    """The :class:`Built` run of ``cfg`` on ``data`` and ``model``: the registered builder called
    with the ``[sampler]`` keys, translated by :data:`_ARGUMENTS` (``mode``: the federated mode if
    already found, given to a sampler that takes it instead of a search here). When the run whitens
    (:mod:`fedmcmc.app.whiten`), in this order: the mode (the sampler's, else found once here),
    the Laplace approximation there (kept for :func:`with_start`), the whitened model, the
    automatic step on it, and the sampler on it (QLSD*'s mode mapped to ``z``, no second search).
    A run that has the mode gives it to CG-DSGLD as the ``anchor`` of its surrogates. The run
    carries the config's typed settings: ``settings`` (what :func:`validate` returned), else
    those of ``cfg``.

    Every estimator asks ``federation`` (:mod:`fedmcmc.estimators.federation`; None: the clients of
    ``data`` in this process), the whitened one through the server's map
    (:class:`~fedmcmc.estimators.federation.Whitened`). A Flower node builds its server's run from
    what the server found, without a round: ``mode`` and ``known``, the step's record (``step``)
    and, when the run whitens, the map (``whitening``) and the mode in ``z`` (``mode_in_z``)
    (:func:`fedmcmc.app.flower.asks.known`)."""
    from fedmcmc.app import posterior, whiten
    from fedmcmc.estimators import federation as federation_lib
    from fedmcmc.models import whitened, whitening

    settings = settings or Settings.from_config(cfg)
    name, section = sampler_name(cfg), cfg["sampler"]
    entry = REGISTRY[name]
    use, why = whiten.setting(cfg)
    known = known or {}
    run_data = data.pooled() if entry.pooled else data
    fed = federation_lib.federation(model, run_data) if federation is None else federation
    run = _Run(name, data, model, mode, fed)
    params = _parameters(name)
    # what the section gives first, so that a bad value fails before the run's own work (the mode)
    made = sorted((param for param in params if param in _ARGUMENTS), key=lambda param: not _ARGUMENTS[param].keys)
    args = {param: _ARGUMENTS[param].make(section, run) for param in made}
    args.update({param: section[_RENAMED.get(param, param)] for param in params
                 if param not in _ARGUMENTS and _RENAMED.get(param, param) in section})
    auto_step, mode = section.get("step_size") == "auto", args.get("mode")
    step, approximated, moved, paid = {"value": section.get("step_size"), "rule": "given"}, None, None, False
    on = (model, mode)  # what the step and the sampler see: the model and its mode, or the whitened ones
    if use and "whitening" in known:  # a Flower node: the server's map and mode in z, no round of its own
        w = known["whitening"]
        if w is None:
            use = False
        else:
            moved, on = (w, {"used": True}), (whitened(model, w.centre, w.factor), known.get("mode_in_z"))
            args.update({"model": on[0], **({"mode": on[1]} if "mode" in args else {})})
    elif use:
        paid = mode is None and auto_step  # the mode the step would have found: its cost is the step's
        mode = gradients.find_mode(model, fed) if paid else mode
        on = (model, mode)
        approx, laplace = approximated = posterior.approximate(model, fed, mode)
        if approx is None and settings.run.whiten is True:
            raise ConfigError(f"[run] whiten = true needs the Laplace approximation at the mode: {laplace['why']}; "
                              "set whiten = false")
        if approx is None:
            use, why = False, laplace["why"]
        else:
            w = whitening(approx)
            moved = (w, whiten.record(w, run_data.num_clients, None if posterior.wanted(cfg) else laplace))
            on = (whitened(model, w.centre, w.factor), None if mode is None else whiten.mode_in_z(model, mode, w))
            args.update({"model": on[0], **({"mode": on[1]} if "mode" in args else {})})
    found = None
    if auto_step:
        from fedmcmc.app import auto_step as auto

        param = next(p for p in params if _RENAMED.get(p, p) == "step_size")
        if "step" in known:  # a Flower node: the server's step
            step, found = known["step"], on[1]
            args[param] = step["value"] if isinstance(step["value"], float) else np.asarray(step["value"])
        else:
            asked = fed if moved is None else federation_lib.Whitened(fed, moved[0])
            args[param], step, found = auto.auto_step(settings.run.seed, name, args, on[0], asked, on[1],
                                                      whitened=moved is not None)
        if paid:
            step = {**step, "rounds": step["rounds"] + mode.rounds, "bits": step["bits"] + mode.bits}
        mode = mode or found
        for key, rule in entry.auto_keys.items():
            if section.get(key) == "auto":
                try:
                    value = rule(step, args)
                except ValueError as err:
                    raise ConfigError(f"[sampler] {key} = \"auto\": {err}") from None
                step, resolved = {**step, key: value}, {**section, key: value}
                args.update({param: value if param == key else _ARGUMENTS[param].make(resolved, run) for param in params
                             if param == key or (param in _ARGUMENTS and key in _ARGUMENTS[param].keys)})
        step = {**step, **auto.budget(step, settings.run, args)}
    in_sampler = on[1] if on[1] is not None else found  # the mode in the sampler's coordinates, if the run has it
    if "anchor" in args and in_sampler is not None:
        args["anchor"] = np.asarray(in_sampler.theta, np.float32)
    args, privacy_record = privacy.settle(cfg, name, args, data, entry.pooled, ConfigError, settings)
    sampler = entry.build(**args)
    return Built(run_data, model, exact, sampler, mode, tests, info, step,
                 privacy_record, laplace=approximated, whitening=moved or (None, {"used": False, "why": why}),
                 settings=settings, federation=fed)


def with_start(cfg: dict, built: Built) -> Built:
    """The run with its Laplace approximation (:func:`fedmcmc.app.posterior.laplace`) and the
    chains' starting points by ``[run] init`` (:func:`fedmcmc.app.posterior.starts`), mapped to
    ``z`` when the sampler runs whitened."""
    from fedmcmc.app import posterior

    approx, record = posterior.laplace(cfg, built)
    start = posterior.starts(cfg, built.model.dim, approx)
    w, entry = built.whitening
    if w is not None:
        start = w.to_z(start)
    return built._replace(laplace=(approx, record), start=start, whitening=(w, entry))


def in_theta(built: Built, res):
    """The result ``res`` of a run of ``built`` with its draws in ``theta``, the model's coordinates
    (mapped from ``z`` when the sampler ran whitened; as it is otherwise)."""
    w = built.whitening[0]
    return res if w is None else res._replace(samples=w.to_theta(res.samples))


def identity(cfg: dict) -> dict:
    """The config's keys that change the draws, part of a run's identity
    (:mod:`fedmcmc.runtime.identity`): all but ``[run] devices``, ``[run] posterior_check`` (a
    check of the finished draws) and ``[flower]``, which do not."""
    return {**{k: v for k, v in cfg.items() if k != "flower"},
            "run": {k: v for k, v in cfg["run"].items() if k not in ("devices", "posterior_check")}}


def run(path: str | Path, out: str | Path, resume: bool = False, progress: bool = True,
        overwrite: bool = False) -> dict:
    """Run a config file with the simulator into ``out``: ``config.toml`` (the text as given),
    the chunks as they finish, then :func:`report`'s outputs. Nothing is written when the
    config or its data are refused, nor into a folder that holds a run without ``resume`` or
    ``overwrite`` (:func:`fedmcmc.runtime.identity.claim`); a resume of another run is refused
    naming the first setting that differs."""
    from fedmcmc.app import auto_step as auto, whiten
    from fedmcmc.runtime import devices, identity as run_identity
    from fedmcmc.runtime.records import DivergenceError
    from fedmcmc.runtime.simulator import simulate
    path, out = Path(path), Path(out)
    cfg = _read(path)
    settings = validate(cfg)
    started = time.perf_counter()
    built = build(cfg, path.parent, settings)
    r = settings.run
    if built.whitening[0] is not None:
        print(whiten.describe(built.whitening[1]))
    if built.step["rule"] != "given":
        print(auto.describe(built.step))
        short = auto.budget_warning(built.step, r)
        if short:
            sys.stderr.write(f"fedmcmc: warning: {short}\n")
    devices.placement(r.devices, r.num_chains)  # refused before anything is written (the schedule: by validate)
    built = with_start(cfg, built)
    run_identity.claim(out, resume, overwrite)
    if not resume:  # a resumed run's, once its checkpoint is found to be this run's
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.toml").write_text(path.read_text())
    try:
        res = simulate(r.seed, built.sampler, built.data, built.start, r.num_iterations,
                       num_chains=r.num_chains, burn_in=r.burn_in, thinning=r.thinning,
                       chunk_size=r.chunk_size, out_dir=out, resume=resume, overwrite=overwrite,
                       settings=identity(cfg), progress=progress, devices=r.devices)
    except DivergenceError as err:  # with the run's step, for the advice
        raise DivergenceError(err.iteration, err.chains, built.step) from None
    if resume:
        (out / "config.toml").write_text(path.read_text())
    return report(cfg, built, in_theta(built, res), out, started)


def report(cfg: dict, built: Built, res, out: str | Path, started: float, evaluations=None, **extra) -> dict:
    """Write ``results.json``, ``posterior.nc`` and ``trace.png`` of a finished run to ``out`` (shared
    by ``fedmcmc run`` and ``fedmcmc flower sim|deploy``, its draws in ``theta``: :func:`in_theta`);
    ``extra`` entries are added to ``results.json``; ``evaluations``, the clients' held-out points
    computed on the Flower nodes (:func:`fedmcmc.app.outputs.evaluate`), replace ``built.tests``. The errors against the exact posterior are
    there for a ``[problem]``; ``inputs`` records a ``[data]`` run's data, whose outputs are :func:`fedmcmc.app.outputs.write_run`'s."""
    from fedmcmc.app import outputs, posterior  # the writers and plots: not needed to build a run (a Flower client)
    from fedmcmc.evaluation import diagnostics
    from fedmcmc.runtime import io

    exact, keep = built.exact, built.settings.run.max_stored_draws
    every = io.stride(res.samples.shape[1], keep)
    approx, laplace = built.laplace or (None, {"available": False, "why": "not computed by this runtime"})
    names = None if built.inputs is None else outputs.parameter_names(built.model, built.inputs.feature_names)
    checked = posterior.check(res.samples, approx, laplace, names)
    mean = res.samples.mean(axis=(0, 1))
    var = res.samples.var(axis=(0, 1))
    payload = {
        "config": cfg,
        "sampler": built.sampler.name,
        "num_draws": int(res.samples.shape[1]),
        "num_stored_draws": int(res.samples.shape[1]) // every,
        "stored_every": every,
        "inputs": None if built.inputs is None else built.inputs._asdict(),
        **({} if exact is None else {
            "posterior_mean_error": float(np.linalg.norm(mean - exact.mean)),
            "posterior_variance_ratio": float(np.mean(var) / exact.var),
            "exact_posterior": {"variance": exact.var, "mean_norm": float(np.linalg.norm(exact.mean))}}),
        "upload_bits_per_chain": float(res.total_bits_up.mean()),
        "download_bits_per_chain": float(res.total_bits_down.mean()),
        "bits_per_iteration": float(res.total_bits_up.mean() / res.num_iterations),
        "mean_active_clients": float(res.active.sum(axis=1).mean()
                                     / max(res.samples.shape[1] // res.draws_per_round * res.thinning, 1)),
        "setup_bits_per_chain": float(res.setup_bits_up.mean() + res.setup_bits_down.mean()),
        "diagnostics": diagnostics.summary(res.samples),
        "step": built.step,
        "privacy": built.privacy,
        "theta_star": (None if built.mode is None or "mode" not in _parameters(sampler_name(cfg))
                       else {"rounds": built.mode.rounds, "bits": built.mode.bits}),
        "heterogeneity": None if built.mode is None else gradients.heterogeneity(
            built.mode, None if approx is None else (approx.cov if approx.cov is not None else approx.sd**2)),
        "laplace": laplace,
        "whitening": built.whitening[1],
        "posterior_check": checked,
        "sampler_seconds": res.wall_seconds,
        "wall_seconds": time.perf_counter() - started,
        **extra,
    }
    out = Path(out)
    io.write_json(out / "results.json", privacy.released(built.privacy, payload))
    if built.inputs is None:
        outputs.write_problem_run(out, cfg, built, res, keep, checked)
    else:
        payload["summary"] = outputs.write_run(out, cfg, built, res, keep, checked, evaluations=evaluations)
    line = posterior.message(checked) if "flagged" in checked else None
    if line:
        sys.stderr.write(f"fedmcmc: warning: {line}\n")
    return payload
