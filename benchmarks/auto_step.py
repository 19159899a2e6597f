"""Every registered sampler with ``step_size = "auto"`` against a long NUTS reference, on problems
of different shape, as a user runs them: only ``[data]``, ``[model]`` and ``[sampler]`` with
the sampler's required keys (docs/reproductions.md, "No tuning").

The problems are the example inputs of ``fedmcmc example`` (each site its own CSV file, in
the data's own units):

* ``hospitals``: three-hospitals, logistic regression on 30 features (31 parameters);
* ``banks``: four-banks, logistic regression, banks split by income (4 parameters);
* ``births``: birth-weights, linear regression with unknown noise (8 parameters);
* ``births-raw``: the same with ``standardise = false``: features and target in their own units;
* ``diamonds``: linear regression with unknown noise on 24 correlated features (26 parameters).

The reference is NUTS (BlackJAX, window adaptation, 4 chains of 2,000 draws after 1,000 warm-up
steps) on the pooled posterior of the same model, run in the coordinates of the Laplace
approximation at the mode (``theta = theta* + L z``: an exact change of variables, so that NUTS's
diagonal mass matrix suits a correlated posterior) and started there; its R-hat and ESS are
recorded. A sampler's error is the mean over parameters of the marginal W1 distance to the
reference divided by the reference's standard deviation (``W1/sd``), on the stored draws.

    PYTHONPATH=src python benchmarks/auto_step.py OUT_DIR [--problems P ...] [--samplers S ...]

Writes ``OUT_DIR/auto_step.json`` (one record per problem and sampler, each naming the commit that
ran it; ``meta`` holds the last invocation's provenance) and prints the table of docs/reproductions.md
(:mod:`fedmcmc.app.tables` renders it, there from the committed ``docs/figures/auto_step.json``).
"""

from __future__ import annotations

import argparse
import json
import time
import tomllib
from pathlib import Path

import numpy as np

from fedmcmc.app import config, examples, tables
from fedmcmc.estimators import approximation, gradients
from fedmcmc.evaluation import reference
from fedmcmc.evaluation.distances import wasserstein1
from fedmcmc.models.whitened import whitened, whitening
from fedmcmc.runtime import io, provenance

#: Problem -> (example, its config file, changes to its [data]).
PROBLEMS = {
    "hospitals": ("three-hospitals", "hospitals.toml", {}),
    "banks": ("four-banks", "banks.toml", {}),
    "births": ("birth-weights", "births.toml", {}),
    "births-raw": ("birth-weights", "births.toml", {"standardise": False}),
    "diamonds": ("diamonds", "diamonds.toml", {}),
}
#: Row label -> [sampler] keys besides step_size = "auto": the keys a sampler must set, at values a
#: user would try first ("auto" where the key takes it); qlsd++ without whitening shows what whitening does.
SAMPLERS = {
    "sgld": {"name": "sgld"},
    "psgld": {"name": "psgld"},
    "qlsd#": {"name": "qlsd#", "compression": {"bits": 8}, "batch_fraction": 0.1},
    "qlsd*": {"name": "qlsd*", "compression": {"bits": 8}, "batch_fraction": 0.1},
    "lsd*": {"name": "lsd*", "batch_fraction": 0.1},
    "qlsd++": {"name": "qlsd++", "compression": {"bits": 8}, "batch_fraction": 0.1},
    "lsd++": {"name": "lsd++", "batch_fraction": 0.1},
    "fa-hmc": {"name": "fa-hmc", "num_leapfrog": 10, "local_steps": 10, "clock": "leapfrog"},
    "fa-ld": {"name": "fa-ld", "local_steps": 10},
    "dsgld": {"name": "dsgld", "local_steps": 10},
    "cg-dsgld taylor": {"name": "cg-dsgld", "local_steps": 10, "surrogate": "taylor"},
    "cg-dsgld laplace": {"name": "cg-dsgld", "local_steps": 10, "surrogate": "laplace"},
    "cg-dsgld sgld": {"name": "cg-dsgld", "local_steps": 10, "surrogate": "sgld", "surrogate_step_size": "auto"},
    "dg-sgld": {"name": "dg-sgld", "rho": "auto", "num_local_steps": 10},
    "qlsd++ whiten = false": {"name": "qlsd++", "compression": {"bits": 8}, "batch_fraction": 0.1, "whiten": False},
}
# the rows and columns of docs/reproductions.md's table, which fedmcmc.app.tables renders
assert tuple(SAMPLERS) == tables.AUTO_STEP_SAMPLERS and tuple(PROBLEMS) == tables.AUTO_STEP_PROBLEMS
RUN = {"seed": 0, "num_chains": 4, "num_iterations": 20000, "burn_in": 2000, "thinning": 10}
#: NUTS reference: draws per chain, chains, warm-up steps.
NUTS = (2000, 4, 1000)


def _toml(cfg: dict) -> str:
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)
    return "\n".join(f"[{section}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in keys.items())
                     for section, keys in cfg.items())


def problem_config(out: Path, problem: str) -> tuple[Path, dict]:
    """The example's folder and its ``[data]`` and ``[model]`` (with the problem's changes)."""
    example, name, changes = PROBLEMS[problem]
    folder = out / "inputs" / example
    if not (folder / name).is_file():
        examples.EXAMPLES[example](folder)
    cfg = tomllib.loads((folder / name).read_text())
    return folder, {"data": {**cfg["data"], **changes}, "model": cfg["model"]}


def nuts_reference(folder: Path, base: dict) -> dict:
    """NUTS on the pooled posterior in the Laplace approximation's coordinates, mapped back."""
    cfg = {**base, "sampler": {"name": "sgld", "step_size": 1e-3}, "run": {"num_chains": 1, "num_iterations": 1}}
    built = config.build(cfg, folder)
    mode = gradients.find_mode(built.model, built.data)
    w = whitening(approximation.laplace_approximation(built.model, built.data, mode))
    model = whitened(built.model, w.centre, w.factor)
    started = time.perf_counter()
    ref = reference.nuts(0, model, built.data, *NUTS, name=f"auto-step-{model.name}")
    return {"draws": w.to_theta(ref.samples.astype(np.float64)), "rhat": ref.rhat, "ess": ref.ess, "divergences": ref.divergences,
            "seconds": time.perf_counter() - started}


def error(draws: np.ndarray, ref: np.ndarray) -> float:
    """Mean over parameters of the marginal W1 to the reference over the reference's sd."""
    flat, pooled = draws.reshape(-1, draws.shape[-1]), ref.reshape(-1, ref.shape[-1])
    return float(np.mean(wasserstein1(flat, pooled) / pooled.std(axis=0)))


def run_config(path: Path, cfg: dict, out: Path) -> tuple[dict, np.ndarray | None, float]:
    """Write ``cfg`` to ``path`` and run it into ``out/run``: ``(results.json's payload, the stored
    draws, the run's seconds)``, or ``({"refused": ...}, None, seconds)`` for a refusal (ConfigError)
    or a divergence."""
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(_toml(cfg))
    started = time.perf_counter()
    try:
        payload = config.run(path, out / "run", progress=False, overwrite=True)
    except (ValueError, RuntimeError) as err:
        return {"refused": f"{type(err).__name__}: {err}"}, None, time.perf_counter() - started
    seconds = time.perf_counter() - started
    layout = config.build(tomllib.loads(path.read_text()), path.parent).model.layout
    return payload, io.read_draws(out / "run" / "posterior.nc", layout), seconds


def start(doc: str, name: str, problems, samplers) -> tuple[argparse.Namespace, Path, dict, dict]:
    """A benchmark's command line (``OUT_DIR [--problems ...] [--samplers ...]``), the path of its
    results file ``OUT_DIR/name``, the records already there (records merge over runs), and this
    invocation's provenance (each record names its commit)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--problems", nargs="*", default=list(problems))
    parser.add_argument("--samplers", nargs="*", default=list(samplers))
    args = parser.parse_args()
    path = args.out / name
    return args, path, json.loads(path.read_text()) if path.is_file() else {}, provenance.record()


def run_one(folder: Path, base: dict, keys: dict, out: Path, ref: np.ndarray) -> dict:
    keys = dict(keys)
    run = {**RUN, **({"whiten": keys.pop("whiten")} if "whiten" in keys else {})}
    cfg = {**base, "sampler": {**keys, "step_size": "auto"}, "run": run}
    started = time.perf_counter()
    payload, draws, _ = run_config(folder / f"{out.parent.name}-{out.name}.toml", cfg, out)
    if draws is None:
        return {**payload, "seconds": time.perf_counter() - started}
    check = payload["posterior_check"]
    return {"w1_over_sd": error(draws, ref), "step": payload["step"], "whitening": payload.get("whitening"),
            "posterior_check": check.get("passed"), "max_rhat": payload["diagnostics"]["max_rhat"], "seconds": time.perf_counter() - started}


def main() -> None:
    args, path, records, prov = start(__doc__, "auto_step.json", PROBLEMS, SAMPLERS)
    records["meta"] = {"provenance": prov, "run": RUN, "nuts": NUTS}
    for problem in args.problems:
        folder, base = problem_config(args.out, problem)
        ref = nuts_reference(folder, base)
        rec = records.setdefault(problem, {})
        rec["reference"] = {k: v for k, v in ref.items() if k != "draws"}
        print(f"{problem}: NUTS R-hat {ref['rhat']:.3f}, ESS {ref['ess']:.0f}, {ref['divergences']} divergences",
              flush=True)
        for label in args.samplers:
            result = run_one(folder, base, SAMPLERS[label], args.out / problem / label.replace(" ", "_"),
                             ref["draws"])
            rec[label] = {**result, "commit": prov["commit"]}
            shown = result.get("refused") or f"W1/sd {result['w1_over_sd']:.3f}, check {result['posterior_check']}"
            print(f"  {label:24s} {shown} ({result['seconds']:.0f} s)", flush=True)
            path.write_text(json.dumps(records, indent=1, default=str))
    table(records)


def table(records: dict) -> None:
    """Print the table of docs/reproductions.md, "No tuning" (:mod:`fedmcmc.app.tables`)."""
    print("\n".join(tables.TABLES["auto_step"].render(records)))


if __name__ == "__main__":
    main()
