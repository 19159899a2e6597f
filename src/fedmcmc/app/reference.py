"""The run-config reference (``docs/reference/config.md``), generated from the code.

The sections and their keys come from the tables the config check uses
(:mod:`fedmcmc.app.config`, :mod:`fedmcmc.app.inputs`, :mod:`fedmcmc.app.problems`,
:mod:`fedmcmc.app.privacy`, and the sampler builders' signatures through
:func:`fedmcmc.app.config.sampler_keys`); ``[run]`` and ``[flower]`` come from the fields of
:class:`fedmcmc.runtime.settings.RunSettings` and :class:`~fedmcmc.runtime.settings.FlowerSettings`,
their defaults and their ``metadata["doc"]``. The one-line description of every other key is
:data:`DESCRIPTIONS`, the only place it is written. A key without a description stops the
generation, so the reference cannot miss one (``tests/app/test_reference.py`` checks that the
committed page is this module's output).

Regenerate the page with::

    python -m fedmcmc.app.reference > docs/reference/config.md
"""

from __future__ import annotations

import inspect
from dataclasses import MISSING, fields

from fedmcmc.app import config, inputs, privacy, problems
from fedmcmc.runtime.settings import FlowerSettings, RunSettings
from fedmcmc.samplers import ALIASES, REGISTRY

__all__ = ["DESCRIPTIONS", "markdown"]

#: One line per key of every section but ``[run]`` and ``[flower]`` (their fields' docs): what it
#: sets (defaults that the code does not hold in a table are stated here).
DESCRIPTIONS: dict[str, dict[str, str]] = {
    "problem": {
        "name": "The built-in problem, one of those below.",
        "seed": "Seed of the generated data.",
        "data_seed": "Seed of the generated data.",
        "num_clients": "Number of clients.",
        "num_shards": "Number of shards (clients).",
        "dim": "Dimension of the parameter.",
        "min_size": "Fewest points of a client (less than `max_size`).",
        "max_size": "Most points of a client.",
        "mean_spread": "Spread of the clients' means.",
        "points_per_shard": "Points of each shard.",
        "centre_range": "The shards' centres are uniform in `[-centre_range, centre_range]^2`.",
        "blob_scale": "Standard deviation of the points around their shard's centre.",
        "prior_var": "Variance of the Gaussian prior on the mean.",
    },
    "data": {
        "files": "One client per file, paths relative to the config file's folder (or `{ images = ..., labels = "
                 "... }` for IDX).",
        "file": "One file for all the data, dealt over clients by `partition`.",
        "builtin": "A built-in data set (`fedmcmc list` names them), dealt over clients by `partition`.",
        "partition": 'With `file` or `builtin`: `{ kind = ..., num_clients = ... }`, kind `"iid"`, `"unbalanced"` '
                     '(`sigma`), `"dirichlet"` (`alpha`), `"dominant_label"` or `"beta_binary"` (`a`, `b`).',
        "format": 'File format, else from the suffix: `.csv`, `.npz` (arrays `x`, `y`), `.svm`/`.libsvm`, `.json` '
                  "(LEAF: each user a client).",
        "target": "The CSV target column, by name or index.",
        "delimiter": 'CSV delimiter. Default `","`.',
        "header": "Whether a CSV file has a header row. Default true.",
        "drop": "CSV columns left out.",
        "num_features": "Width of LIBSVM rows (1-based indices).",
        "task": '`"classification"` (default) or `"regression"`.',
        "classes": "The class labels, in order; without it labels must be class indices 0, 1, ...",
        "test_fraction": "Each client's held-out part (0: none). Default 0.2.",
        "standardise": "Standardise the features (and a regression target) with the pooled mean and standard "
                       "deviation from the clients' moments. Default true.",
        "seed": "Seed of the held-out splits and the partition. Default 0.",
    },
    "model": {
        "name": "A built-in model (below), or `\"package.module:function\"` returning a `fedmcmc.Model`.",
        "temperature": "Tempers the posterior (`fedmcmc.models.tempered`).",
        "noise_scale": '`"unknown"` (`log sigma` sampled too, last coordinate) or the known noise standard deviation, '
                       "in the target's units.",
        "prior_scale": "Standard deviation of the Gaussian prior on the weights.",
        "intercept": "Add an intercept.",
        "hidden": "Widths of the hidden layers.",
        "activation": "Activation function of the hidden layers.",
        "pooling": "Pooling of the convolutional layers.",
    },
    "sampler": {
        "step_size": 'The step size (FedAvg: its learning rate), or `"auto"`: from the curvature at the federated '
                     "mode, by the sampler's rule.",
        "batch_size": "Minibatch size per client (one for all or one per client); full batches if left out.",
        "batch_fraction": "Minibatch size as a fraction in (0, 1] of each client's points (instead of `batch_size`).",
        "compression": 'Upload compressor: `"none"`, `{ bits = p }`, `{ levels = s }` (QSGD), optionally with '
                       "`fixed_point = { fraction_bits = ..., max_abs = ... }`.",
        "participation": "Partial participation: `p` (each client active with probability p) or "
                         '`{ p = ..., scaling = "active" }` (or `"inverse_probability"`); full if left out.',
        "beta": "RMSprop decay of the preconditioner.",
        "lam": "Added to the preconditioner's square root, keeping it bounded.",
        "refresh_every": "Rounds between moves of the SVRG anchor.",
        "memory": "Use the memory terms (false: QLSD with SVRG gradients).",
        "memory_rate": ("Memory rate alpha in [0, 1] (one, or one per client); default `1 / (omega + 1)`, or "
                        '`p_i / (omega + 1)` with `memory_update = "inverse_probability"`, which refuses '
                        "`alpha (omega + 1) / p_i > 1`."),
        "memory_update": '`"algorithm"` (Algorithm 2) or `"inverse_probability"` (scaled by 1/p_i).',
        "num_leapfrog": "K, leapfrog steps per trajectory (the momentum is redrawn every K steps); \"auto\" with "
                        "step_size = \"auto\" (clock = \"trajectory\", full batches, uncompressed, full participation, up "
                        "to 200 parameters): K and the step from the exact law of a round on the clients' Laplace "
                        "approximations (`fedmcmc.samplers.fa_hmc_law`).",
        "local_steps": "Local steps per round (FA-HMC: counted on `clock`).",
        "correlation": "Share in [0, 1] of the momentum's (VR-FALD*: the noise's) variance drawn from the common seed.",
        "gradient_noise": "Standard deviation of Gaussian noise added to every gradient (simulated stochastic "
                          "gradients).",
        "debiased": "Use the de-biased gradient (FA-HMC's Algorithm B.2).",
        "clock": '`"leapfrog"` (T leapfrog steps per round) or `"trajectory"` (T trajectories of K steps).',
        "momentum_sync": 'At a synchronisation inside a trajectory, `"local"` keeps each client\'s momentum, '
                         '`"average"` replaces it by the weighted average.',
        "shard_probs": '`"uniform"` (default, f_s = 1/S) or `"size"` (f_s = N_s / N): probabilities of visiting '
                       "each shard.",
        "record_every": "Local steps between recorded draws (divides `local_steps`); default one draw a visit.",
        "conducive": "Conducive gradients (a Python object); use `cg-dsgld` in a config.",
        "surrogate": 'Shard surrogates: `"taylor"` (default, exact for conjugate Gaussian models), `"laplace"` or '
                     '`"sgld"` (moments of local SGLD draws).',
        "surrogate_covariance": 'Covariance of the surrogates: `"full"` (default) or `"diag"`.',
        "surrogate_step_size": 'Step of the SGLD surrogates\' local chains (required with `surrogate = "sgld"`), '
                               'or `"auto"` with `step_size = "auto"`.',
        "surrogate_steps": "Steps of the SGLD surrogates' local chains. Default 5000.",
        "surrogate_burn_in": "Burn-in of the SGLD surrogates' local chains. Default 1000.",
        "alpha": "Scale of the conducive gradient.",
        "likelihood_only": "Fit each shard's surrogate to its likelihood only (without the prior).",
        "rho": 'Tolerance rho > 0 tying the clients\' z_i to theta (one, or one per client), or `"auto"` with '
               '`step_size = "auto"`.',
        "num_local_steps": "Langevin steps on z_i per round.",
        "step_decay": "The dynamic step of FA-HMC's Proposition 4.5: `step_size` for the first `step_decay` "
                      "trajectories, then stages of doubling length with the step divided by sqrt(2) at each; or "
                      '`"auto"` with `step_size = "auto"` (the proposition\'s first stage at the automatic step). '
                      "Default: a constant step.",
        "prior_step_size": "Draw theta with one Langevin step of this size instead of exactly (needed when the "
                           "prior is neither Gaussian nor flat).",
        "aggregation": '`"mcmahan"` (weighted average over the active clients) or `"unbiased"` (participation '
                       "weights).",
        "control_variates": "SCAFFOLD's correction (`fedmcmc.samplers.scaffold.scaffold()`, a Python object).",
        "num_draws": "Draws each site records a round, every `local_steps / num_draws`-th local step (divides "
                     "`local_steps`; more than the dimension when a covariance is inverted); default `local_steps`.",
        "local_burn_in": "Unrecorded local steps at the start of the first round. Default 0.",
        "weighting": 'Consensus weights: `"covariance"` (the inverse sample covariance of each site\'s draws) or '
                     '`"diagonal"` (the inverse sample variances).',
    },
    "privacy": {
        "delta": "The delta of (epsilon, delta), in (0, 1).",
        "epsilon": "A budget: the run meets it at `level` or is refused.",
        "level": '`"client"` (default) or `"record"`: the unit the budget protects.',
        "clip": "C, the bound on a client's decoded upload norm; chosen from the budget if left out.",
        "record_clip": "C_r, the bound on one record's gradient norm; chosen from the budget if left out.",
        "accountant": '`"rdp"` (default) or `"pld"`.',
        "release": '`"all"` (default) or `"draws"`: write only what the (epsilon, delta) covers.',
        "publish_seed": "Write `[run] seed` into the outputs (listed as not covered). Default false.",
    },
}

_SECTIONS = {
    "run": "Every config. How many chains and rounds, and what the run does around the sampler.",
    "problem": "A built-in problem with an exact posterior (instead of `[data]` and `[model]`). Its keys "
               "depend on `name`.",
    "data": "Your data (with `[model]`, instead of `[problem]`). Relative paths start at the config file's folder.",
    "model": "The model of your data. A built-in model's keys depend on `name`; a function of your own is called "
             "with the keys it takes, plus those the data supply (`num_features`, `num_classes`, `input_shape`, "
             "`target_scale`).",
    "sampler": "Every config. `name` and the keys of that sampler (derived from its builder's signature; "
               "`fedmcmc list` prints them too).",
    "flower": "Optional: the Flower runtime's settings (`fedmcmc flower`; `fedmcmc run` checks them and runs "
              "without them). See docs/flower.md.",
    "privacy": "Optional: clipping and the (epsilon, delta) the run meets. See docs/privacy.md.",
}


#: The sections whose keys, defaults and descriptions are a settings class's fields.
_TYPED = {"run": RunSettings, "flower": FlowerSettings}


def _fields(cls) -> dict:
    """A dataclass's fields by name."""
    return {f.name: f for f in fields(cls)}


def _describe(section: str, key: str) -> str:
    if section in _TYPED:
        return _fields(_TYPED[section])[key].metadata["doc"]
    try:
        return DESCRIPTIONS[section][key]
    except KeyError:
        raise KeyError(f"[{section}] {key} has no description; add one to fedmcmc.app.reference.DESCRIPTIONS") from None


def _toml(value) -> str:
    """A value as it is written in TOML."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{value}"'
    return str(list(value) if isinstance(value, tuple) else value)


def _value(value) -> str:
    return f"`{_toml(value)}`"


def _default(p: inspect.Parameter) -> str:
    if p.default is inspect.Parameter.empty:
        return "required"
    return "" if p.default is None else _value(p.default)


def _table(rows, header=("key", "default", "description")) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def _typed(section: str, order=None) -> list[str]:
    """The table of a typed section: each field with its default (``required`` without one) and doc."""
    rows = []
    for key, f in sorted(_fields(_TYPED[section]).items(), key=order):
        default = "required" if f.default is MISSING else "" if f.default is None else _value(f.default)
        rows.append((f"`{key}`", default, _describe(section, key)))
    return _table(rows)


def _run() -> list[str]:
    return _typed("run", order=lambda item: item[0])


def _problem() -> list[str]:
    lines = _table([("`name`", "required", _describe("problem", "name"))])
    for name in problems.PROBLEMS:
        lines += ["", f'`name = "{name}"`: {problems.summary(name)}', ""]
        lines += _table([(f"`{k}`", _value(v), _describe("problem", k)) for k, v in problems.settings(name).items()])
    return lines


def _data() -> list[str]:
    return _table([(f"`{k}`", _describe("data", k)) for k in sorted(inputs.DATA_KEYS)], ("key", "description"))


def _model() -> list[str]:
    lines = _table([("`name`", "required", _describe("model", "name")),
                    ("`temperature`", _value(1.0), _describe("model", "temperature"))])
    for name, (build, task) in inputs.MODELS.items():
        keys, _ = inputs.builder_keys(build)
        params = inspect.signature(build).parameters
        lines += ["", f'`name = "{name}"` ({task}):', ""]
        lines += _table([(f"`{k}`", _default(params[k]), _describe("model", k)) for k in params if k in keys])
    return lines


def _sampler() -> list[str]:
    lines = _table([("`name`", "required", "The sampler: one of the table below (aliases: "
                     + ", ".join(f"`{a}` = `{n}`" for a, n in ALIASES.items()) + ").")])
    lines += ["", "Each sampler's keys (**bold**: required; optional keys with their builder's default):", ""]
    rows, takers = [], {}
    for name, reg in REGISTRY.items():
        params = config._parameters(name)
        cells = []
        for key, required in config.sampler_keys(name).items():
            takers.setdefault(key, []).append(name)
            param = params.get(key) or params.get({v: k for k, v in config._RENAMED.items()}.get(key, ""))
            if required:
                cells.append(f"**`{key}`**")
            elif param is not None and param.default not in (None, inspect.Parameter.empty):
                cells.append(f"`{key} = {_toml(param.default)}`")
            else:
                cells.append(f"`{key}`")
        rows.append((f"`{name}`", reg.summary, ", ".join(cells)))
    lines += _table(rows, ("name", "what", "keys"))
    lines += ["", "What each key sets:", ""]
    lines += _table([(f"`{k}`", ", ".join(f"`{n}`" for n in takers[k]), _describe("sampler", k))
                     for k in sorted(takers)], ("key", "samplers", "description"))
    return lines


def _flower() -> list[str]:
    return _typed("flower", order=lambda item: FlowerSettings.keys().index(item[0]))


def _privacy() -> list[str]:
    return _table([(f"`{k}`", "required" if k == "delta" else "", _describe("privacy", k))
                   for k in sorted(privacy.KEYS)])


def markdown() -> str:
    """The reference of every section and key of a run config, as Markdown.

    Returns
    -------
    str
        The text of ``docs/reference/config.md``.

    Raises
    ------
    KeyError
        For a key of the code's tables that :data:`DESCRIPTIONS` does not describe.
    """
    lines = ["# Run config reference", "",
             "<!-- Generated from the code by `python -m fedmcmc.app.reference > docs/reference/config.md`; "
             "do not edit by hand. -->", "",
             "A run config (`fedmcmc run CONFIG.toml`, `fedmcmc flower sim|deploy CONFIG.toml`) is a TOML file "
             "with `[sampler]` and `[run]`, plus either `[problem]` or both `[data]` and `[model]`, and optionally "
             "`[flower]` and `[privacy]`. An unknown section or key is refused before the run starts, naming the "
             "allowed ones. `examples/` has complete configs; docs/tutorial.md walks through one.", ""]
    for section, make in (("run", _run), ("sampler", _sampler), ("problem", _problem), ("data", _data),
                          ("model", _model), ("flower", _flower), ("privacy", _privacy)):
        lines += [f"## [{section}]", "", _SECTIONS[section], ""] + make() + [""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
