"""`fedmcmc run CONFIG.toml`: a run described in a TOML file, validated before it starts.

Example::

    [problem]
    name = "heterogeneous-gaussian"   # built-in problems: see PROBLEMS
    num_clients = 20
    dim = 50

    [sampler]
    name = "qlsd*"                    # sgld, qlsd#, qlsd*, lsd*, qlsd++, lsd++, fa-hmc, fa-ld
    step_size = 4.9e-4
    batch_fraction = 0.1              # or batch_size = 10 (per client), omit for full batches
    compression = { bits = 8 }        # or { levels = 16 }, "none"
    participation = { p = 0.5, scaling = "inverse_probability" }
    # FA-HMC / FA-LD: num_leapfrog = 10 (K), local_steps = 100 (T), correlation = 1.0,
    #                 gradient_noise = 0.0, debiased = false,
    #                 clock = "leapfrog" (T counts leapfrog steps) or "trajectory" (T counts
    #                 trajectories of K steps, Algorithm 3); required for fa-hmc,
    #                 momentum_sync = "local" (default) or "average"
    # DSGLD / CG-DSGLD: local_steps = 200, record_every = 100, shard_probs = "uniform" or "size",
    #                   CG-DSGLD: surrogate = "taylor" | "laplace" | "sgld", surrogate_covariance = "full",
    #                   alpha = 1.0, surrogate_step_size, surrogate_steps, surrogate_burn_in (for "sgld")

    [run]
    seed = 0
    num_chains = 4
    num_iterations = 20000
    burn_in = 10000
    thinning = 10
"""

from __future__ import annotations

import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from fedmcmc.evaluation import diagnostics
from fedmcmc.estimators import gradients, surrogates
from fedmcmc.runtime import io
from fedmcmc.app import problems
from fedmcmc.compression import resolve_compressor
from fedmcmc.samplers.participation import resolve_participation
from fedmcmc.samplers import (cg_dsgld, dg_sgld, dsgld, fa_hmc, fedavg, lsd_pp, lsd_star, psgld, qlsd_pp, qlsd_sharp,
                              qlsd_star, sgld)
from fedmcmc.runtime.simulator import simulate

SAMPLERS = {
    "sgld": "centralised SGLD on the pooled data (baseline)",
    "qlsd#": "QLSD with minibatch gradients (Vono et al. 2022, Alg. 1); alias 'qlsd'",
    "qlsd*": "QLSD with control variates at the mode",
    "lsd*": "QLSD* without compression",
    "qlsd++": "QLSD with SVRG control variates and memory terms (Alg. 2)",
    "lsd++": "QLSD++ without compression",
    "fa-hmc": ("federated averaging of local SG-HMC (Liang et al. 2024): clock = \"leapfrog\" (Sec. 5) or "
               "\"trajectory\" (Alg. 3); debiased = true for Alg. B.2"),
    "fa-ld": "federated averaging Langevin dynamics (Deng et al. 2021): FA-HMC with one leapfrog step",
    "dsgld": "distributed SGLD (Ahn et al. 2014): a chain visits one shard at a time for local_steps steps",
    "cg-dsgld": "DSGLD with conducive gradients from Gaussian shard surrogates (El Mekkaoui et al. 2021); alias 'fsgld'",
    "psgld": "preconditioned SGLD on the pooled data (Li et al. 2016, baseline); beta, lam",
    "dg-sgld": "distributed Gibbs SGLD (Plassier et al. 2021, DG-LMC with minibatches); rho, num_local_steps",
    "fedavg": "FedAvg (McMahan et al. 2017), an optimiser baseline: step_size is the learning rate; local_steps",
}
#: Settings of the baselines, and the common settings each of them takes.
_BASELINE_KEYS = {
    "psgld": ({"beta", "lam"}, set()),
    "dg-sgld": ({"rho", "num_local_steps", "prior_step_size"}, {"participation"}),
    "fedavg": ({"local_steps"}, {"compression", "participation"}),
}
_FA_KEYS = {"num_leapfrog", "local_steps", "correlation", "gradient_noise", "debiased", "clock", "momentum_sync"}
_DSGLD_KEYS = {"local_steps", "record_every", "shard_probs"}
_CG_KEYS = {"surrogate", "surrogate_covariance", "alpha", "surrogate_step_size", "surrogate_steps", "surrogate_burn_in"}
_SURROGATES = ("taylor", "laplace", "sgld")
_SECTIONS = {
    "problem": {"name"}.union(*(problems.settings(name) for name in problems.PROBLEMS)),
    "sampler": {"name", "step_size", "batch_size", "batch_fraction", "compression", "participation",
                "refresh_every", "memory", "memory_rate", "memory_update"} | _FA_KEYS | _DSGLD_KEYS | _CG_KEYS
               | {"beta", "lam", "rho", "num_local_steps", "prior_step_size"},
    "run": {"seed", "num_chains", "num_iterations", "burn_in", "thinning", "chunk_size"},
}
#: Optional sections: settings of the Flower runtime (docs/flower.md), ignored by ``fedmcmc run``.
_OPTIONAL = {"flower": {"round_timeout", "max_upload_norm", "exact"}}


class ConfigError(ValueError):
    """An invalid run configuration."""


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} not found; give the path to a TOML file")
    try:
        cfg = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path} is not valid TOML: {err}") from None
    validate(cfg)
    return cfg


def validate(cfg: dict) -> None:
    for section, keys in _SECTIONS.items():
        if section not in cfg:
            raise ConfigError(f"config needs a [{section}] section")
        unknown = set(cfg[section]) - keys
        if unknown:
            raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{section}]; allowed: {sorted(keys)}")
    for section, keys in _OPTIONAL.items():
        unknown = set(cfg.get(section, {})) - keys
        if unknown:
            raise ConfigError(f"unknown key(s) {sorted(unknown)} in [{section}]; allowed: {sorted(keys)}")
    extra = set(cfg) - set(_SECTIONS) - set(_OPTIONAL)
    if extra:
        raise ConfigError(f"unknown section(s) {sorted(extra)}; allowed: {sorted(_SECTIONS) + sorted(_OPTIONAL)}")
    name = cfg["problem"].get("name")
    if name not in problems.PROBLEMS:
        raise ConfigError(f"unknown problem {name!r}; available: {', '.join(problems.PROBLEMS)}")
    unknown = set(cfg["problem"]) - {"name"} - set(problems.settings(name))
    if unknown:
        raise ConfigError(f"unknown key(s) {sorted(unknown)} for problem {name!r}; allowed: "
                          f"{sorted({'name', *problems.settings(name)})}")
    sampler = str(cfg["sampler"].get("name", "")).lower()
    if sampler not in SAMPLERS and sampler not in ("qlsd", "fsgld"):
        raise ConfigError(f"unknown sampler {cfg['sampler'].get('name')!r}; available: {', '.join(SAMPLERS)}")
    sampler = "cg-dsgld" if sampler == "fsgld" else sampler
    baseline_keys = set().union(*(own for own, _ in _BASELINE_KEYS.values()))
    if sampler in _BASELINE_KEYS:
        own, common = _BASELINE_KEYS[sampler]
        allowed = {"name", "step_size", "batch_size", "batch_fraction"} | own | common
        extra = set(cfg["sampler"]) - allowed
        if extra:
            raise ConfigError(f"{sampler} does not take {sorted(extra)}; it takes {sorted(allowed - {'name'})}")
        if sampler == "dg-sgld" and "rho" not in cfg["sampler"]:
            raise ConfigError("[sampler] dg-sgld needs rho, the tolerance of the auxiliary variables")
    elif set(cfg["sampler"]) & (baseline_keys - {"local_steps"}):
        raise ConfigError(f"{sorted(set(cfg['sampler']) & (baseline_keys - {'local_steps'}))} are settings of "
                          f"pSGLD / DG-SGLD; {sampler} does not take them")
    fa_keys = set(cfg["sampler"]) & _FA_KEYS
    ds_keys = set(cfg["sampler"]) & (_DSGLD_KEYS | _CG_KEYS)
    if sampler in _BASELINE_KEYS:
        pass
    elif sampler in ("dsgld", "cg-dsgld"):
        if "local_steps" not in ds_keys:
            raise ConfigError(f"[sampler] {sampler} needs local_steps, the local steps per visit to a shard")
        extra = (fa_keys - {"local_steps"}) | (set(cfg["sampler"]) & {"compression", "participation", "refresh_every",
                                                                      "memory", "memory_rate", "memory_update"})
        if sampler == "dsgld":
            extra |= ds_keys & _CG_KEYS
        if extra:
            raise ConfigError(f"{sampler} does not take {sorted(extra)} (its participation is the shard schedule, "
                              "shard_probs)")
        surrogate = cfg["sampler"].get("surrogate", "taylor")
        if surrogate not in _SURROGATES:
            raise ConfigError(f"unknown surrogate {surrogate!r}; choose one of {_SURROGATES}")
        if surrogate == "sgld" and "surrogate_step_size" not in ds_keys:
            raise ConfigError("surrogate = \"sgld\" needs surrogate_step_size, the local Langevin step")
        if cfg["sampler"].get("shard_probs", "uniform") not in ("uniform", "size"):
            raise ConfigError("shard_probs must be \"uniform\" (f_s = 1/S) or \"size\" (f_s = N_s / N)")
    elif ds_keys - {"local_steps"}:
        raise ConfigError(f"{sorted(ds_keys - {'local_steps'})} are DSGLD settings; {sampler} does not take them")
    if sampler in _BASELINE_KEYS:
        pass
    elif sampler in ("fa-hmc", "fa-ld"):
        needed = {"local_steps"} | ({"num_leapfrog"} if sampler == "fa-hmc" else set())
        if needed - fa_keys:
            raise ConfigError(f"[sampler] {sampler} needs {', '.join(sorted(needed - fa_keys))}")
        if sampler == "fa-ld" and "num_leapfrog" in fa_keys:
            raise ConfigError("fa-ld takes one leapfrog step by definition; drop num_leapfrog or use fa-hmc")
        if sampler == "fa-hmc" and "clock" not in fa_keys:
            raise ConfigError('[sampler] fa-hmc needs clock, what local_steps counts: "leapfrog" (T leapfrog steps '
                              'per round, as the paper runs it) or "trajectory" (T trajectories of num_leapfrog '
                              'steps per round, Algorithm 3 as printed, and what local_steps meant before the '
                              'clock existed)')
    elif fa_keys - {"local_steps"} or (fa_keys and sampler not in ("dsgld", "cg-dsgld")):
        raise ConfigError(f"{sorted(fa_keys)} are FA-HMC settings; {sampler} does not take them")
    if "step_size" not in cfg["sampler"]:
        raise ConfigError("[sampler] needs step_size")
    if "batch_size" in cfg["sampler"] and "batch_fraction" in cfg["sampler"]:
        raise ConfigError("give batch_size or batch_fraction, not both")
    fraction = cfg["sampler"].get("batch_fraction")
    if fraction is not None and not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
        raise ConfigError(f"batch_fraction must lie in (0, 1] (got {fraction!r})")
    for key in ("num_chains", "num_iterations"):
        if key not in cfg["run"]:
            raise ConfigError(f"[run] needs {key}")


def from_text(text: str) -> tuple[dict, dict[str, Any]]:
    """A run config given as TOML text, checked and built: ``(cfg, built)``. The Flower runtime
    names a run by this text and builds it with this function on every node."""
    cfg = tomllib.loads(text)
    validate(cfg)
    return cfg, build(cfg)


def build(cfg: dict) -> dict[str, Any]:
    """Turn a validated config into data, model, sampler and run settings."""
    p = dict(cfg["problem"])
    problem = p.pop("name")
    for key, value in p.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"[problem] {key} must be a non-negative number (got {value!r})")
    if p.get("min_size", 10) >= p.get("max_size", 200) or p.get("num_clients", 20) < 1 or p.get("dim", 50) < 1:
        raise ConfigError("[problem] needs num_clients >= 1, dim >= 1 and min_size < max_size")
    data, model, exact = problems.PROBLEMS[problem](**p)

    s = dict(cfg["sampler"])
    name = s.pop("name").lower()
    name = {"qlsd": "qlsd#", "fsgld": "cg-dsgld"}.get(name, name)
    step = s.pop("step_size")
    fraction = s.pop("batch_fraction", None)
    batch = s.pop("batch_size", None)
    if fraction is not None:
        batch = np.maximum((np.asarray(data.counts) * fraction).astype(int), 1)
    compressor = resolve_compressor(s.pop("compression", None))
    part = resolve_participation(s.pop("participation", None))
    refresh = s.pop("refresh_every", 100)
    memory = s.pop("memory", True)
    memory_rate = s.pop("memory_rate", None)
    memory_update = s.pop("memory_update", "algorithm")
    extra = {key: s.pop(key) for key in {"beta", "lam", "rho", "num_local_steps", "prior_step_size"} & set(s)}
    if name == "fedavg":
        extra["local_steps"] = s.pop("local_steps", 1)
    fa = {key: s.pop(key) for key in _FA_KEYS & set(s)}
    ds = {key: s.pop(key) for key in (_DSGLD_KEYS | _CG_KEYS) & set(s)}
    if not isinstance(fa.get("debiased", False), bool):
        raise ConfigError(f"[sampler] debiased must be true or false (got {fa['debiased']!r})")
    mode = None
    if name in ("qlsd*", "lsd*"):
        mode = gradients.find_mode(model, data)
    if name == "sgld":
        if batch is not None and np.size(batch) > 1:
            batch = int(np.sum(batch))
        sampler, data = sgld(model, step, batch), data.pooled()
    elif name == "qlsd#":
        sampler = qlsd_sharp(model, step, batch, compressor, part)
    elif name == "qlsd*":
        sampler = qlsd_star(model, step, mode, batch, compressor, part)
    elif name == "lsd*":
        sampler = lsd_star(model, step, mode, batch, part)
    elif name in ("fa-hmc", "fa-ld"):
        fa.setdefault("num_leapfrog", 1)
        sampler = fa_hmc(model, data.weights, step, fa.pop("num_leapfrog"), fa.pop("local_steps"),
                         batch_size=batch, compressor=compressor, participation=part, name=name, **fa)
    elif name in ("dsgld", "cg-dsgld"):
        probs = data.weights if ds.pop("shard_probs", "uniform") == "size" else np.full(data.num_clients, 1 / data.num_clients)
        local = fa.pop("local_steps")
        common = dict(batch_size=batch, record_every=ds.pop("record_every", None), name=name)
        if name == "dsgld":
            sampler = dsgld(model, probs, step, local, **common)
        else:
            sampler = cg_dsgld(model, probs, step, local, surrogate=_surrogate(ds), alpha=ds.pop("alpha", 1.0), **common)
    elif name == "psgld":
        if batch is not None and np.size(batch) > 1:
            batch = int(np.sum(batch))
        sampler, data = psgld(model, step, batch, **extra), data.pooled()
    elif name == "dg-sgld":
        sampler = dg_sgld(model, extra.pop("rho"), step, batch_size=batch, num_clients=data.num_clients,
                          participation=part, **extra)
    elif name == "fedavg":
        sampler = fedavg(model, data.weights, step, extra["local_steps"], batch, compressor, part)
    elif name == "qlsd++":
        sampler = qlsd_pp(model, step, batch, compressor, part, refresh, memory, memory_rate, memory_update)
    else:
        sampler = lsd_pp(model, step, batch, part, refresh, memory_rate, memory_update)
    return {"data": data, "model": model, "exact": exact, "sampler": sampler, "mode": mode}


def _surrogate(ds: dict):
    kind, covariance = ds.get("surrogate", "taylor"), ds.get("surrogate_covariance", "full")
    if kind == "taylor":
        return surrogates.taylor(covariance)
    if kind == "laplace":
        return surrogates.laplace(covariance)
    return surrogates.sgld_moments(ds["surrogate_step_size"], ds.get("surrogate_steps", 5000),
                                   ds.get("surrogate_burn_in", 1000), covariance)


def run(path: str | Path, out: str | Path, resume: bool = False, progress: bool = True) -> dict:
    cfg = load(path)
    started = time.perf_counter()
    built = build(cfg)
    r = dict(cfg["run"])
    model, exact = built["model"], built["exact"]
    res = simulate(r.get("seed", 0), built["sampler"], built["data"], np.zeros(model.dim), r["num_iterations"],
                   num_chains=r["num_chains"], burn_in=r.get("burn_in", 0), thinning=r.get("thinning", 1),
                   chunk_size=r.get("chunk_size"), out_dir=Path(out), resume=resume, progress=progress)
    return report(cfg, built, res, out, started)


def report(cfg: dict, built: dict, res, out: str | Path, started: float, **extra) -> dict:
    """Write ``results.json``, ``posterior.nc`` and ``trace.png`` of a finished run to ``out``
    (shared by ``fedmcmc run`` and ``fedmcmc flower sim|deploy``); ``extra`` entries are
    added to ``results.json``."""
    model, exact = built["model"], built["exact"]
    mean = res.samples.mean(axis=(0, 1))
    var = res.samples.var(axis=(0, 1))
    payload = {
        "config": cfg,
        "sampler": built["sampler"].name,
        "num_draws": int(res.samples.shape[1]),
        "posterior_mean_error": float(np.linalg.norm(mean - exact.mean)),
        "posterior_variance_ratio": float(np.mean(var) / exact.var),
        "exact_posterior": {"variance": exact.var, "mean_norm": float(np.linalg.norm(exact.mean))},
        "upload_bits_per_chain": float(res.total_bits_up.mean()),
        "download_bits_per_chain": float(res.total_bits_down.mean()),
        "bits_per_iteration": float(res.total_bits_up.mean() / res.num_iterations),
        "mean_active_clients": float(res.active.sum(axis=1).mean()
                                     / max(res.samples.shape[1] // res.draws_per_round * res.thinning, 1)),
        "setup_bits_per_chain": float(res.setup_bits_up.mean() + res.setup_bits_down.mean()),
        "diagnostics": diagnostics.summary(res.samples),
        "theta_star": None if built["mode"] is None else {"rounds": built["mode"].rounds, "bits": built["mode"].bits},
        "sampler_seconds": res.wall_seconds,
        "wall_seconds": time.perf_counter() - started,
        **extra,
    }
    out = Path(out)
    io.write_json(out / "results.json", payload)
    io.write_posterior(out / "posterior.nc", {built["sampler"].name: res}, attrs={"config": cfg})
    plot_trace(out / "trace.png", res.samples, exact)
    return payload


def plot_trace(path: Path, samples: np.ndarray, exact) -> None:
    fig, axes = io.new_figure(ncols=2, figsize=(9, 3.2))
    k = 0
    for c in range(samples.shape[0]):
        axes[0].plot(samples[c, :, k], lw=0.6)
    axes[0].axhline(exact.mean[k], color="k", ls="--", lw=1)
    axes[0].set_title("trace of theta[0] per chain")
    axes[0].set_xlabel("draw")
    axes[1].hist(samples[..., k].ravel(), bins=50, density=True, alpha=0.7)
    grid = np.linspace(samples[..., k].min(), samples[..., k].max(), 200)
    axes[1].plot(grid, np.exp(-0.5 * (grid - exact.mean[k]) ** 2 / exact.var) / np.sqrt(2 * np.pi * exact.var), "k--")
    axes[1].set_title("theta[0]: samples vs exact posterior")
    io.save_figure(fig, path)
