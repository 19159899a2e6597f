"""Rounds to a posterior: how many rounds (and bits, and simulator seconds) each federated sampler
with its automatic settings needs before its draws meet three criteria against NUTS:

* max R-hat <= 1.01 and min bulk ESS >= 400 (ArviZ's rank-normalised split R-hat and bulk ESS,
  over all chains), and
* every marginal sd within 10% of the NUTS reference's.

The problems are ``hospitals`` and ``banks`` of ``benchmarks/auto_step.py`` (each site its own CSV
file; the reference is that script's NUTS run). Every run has ``CHAINS`` chains started around the
mode (``[run] init``'s default) and whitened at the mode; a run of ``R`` rounds drops the first
``R / 8`` and keeps every ``R / KEEP``-th round after them. ``R`` doubles from ``FIRST`` until the
criteria are met, a run refuses or diverges, ``R`` passes ``LAST``, or the next run would take more
than ``BUDGET`` seconds (twice the last; then the cell says how far the last run got).

    PYTHONPATH=src python benchmarks/rounds_to_posterior.py OUT_DIR [--problems P ...] [--samplers S ...]

Writes ``OUT_DIR/rounds_to_posterior.json`` (every run's rounds, the automatic step's setup rounds,
criteria, upload bits per chain (all clients) and seconds, with the commit and machine) and ``OUT_DIR/rounds_to_posterior.png`` (max sd deviation
against rounds), and prints the table of docs/flower.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import auto_step
from fedmcmc.app import tables

PROBLEMS = ("hospitals", "banks")
#: Row label -> [sampler] keys besides step_size = "auto" (auto_step.py's first tries, and FA-HMC's
#: trajectory from the exact law of its round, fedmcmc.samplers.fa_hmc_law).
SAMPLERS = {
    **{k: auto_step.SAMPLERS[k] for k in ("qlsd++", "qlsd*", "fa-hmc", "fa-ld", "dsgld", "cg-dsgld taylor",
                                          "dg-sgld")},
    "vr-fald*": {"name": "vr-fald*", "local_steps": 10},
    "fa-hmc num_leapfrog = auto": {"name": "fa-hmc", "num_leapfrog": "auto", "local_steps": 1,
                                   "clock": "trajectory", "correlation": 1.0},
}
CHAINS, KEEP, FIRST, LAST = 32, 1024, 128, 2**18
RHAT, ESS, SD = 1.01, 400, 0.10
#: Seconds the next run of a sampler may take (estimated as twice its last).
BUDGET = 300


def criteria(draws: np.ndarray, ref: np.ndarray) -> dict:
    """``{"max_rhat", "min_ess", "max_sd_deviation", "w1_over_sd", "met"}`` of ``[chains, draws, d]``."""
    import arviz as az

    table = az.summary(az.from_dict(posterior={"x": draws}), kind="diagnostics", round_to="none")
    pooled = ref.reshape(-1, ref.shape[-1])
    deviation = float(np.max(np.abs(draws.reshape(-1, draws.shape[-1]).std(0) / pooled.std(0) - 1)))
    out = {"max_rhat": float(table["r_hat"].max()), "min_ess": float(table["ess_bulk"].min()),
           "max_sd_deviation": deviation, "w1_over_sd": auto_step.error(draws, ref)}
    out["met"] = bool(out["max_rhat"] <= RHAT and out["min_ess"] >= ESS and deviation <= SD)
    return out


def run_one(folder: Path, base: dict, keys: dict, rounds: int, out: Path, ref: np.ndarray) -> dict:
    run = {"seed": 0, "num_chains": CHAINS, "num_iterations": rounds, "burn_in": rounds // 8,
           "thinning": max(1, rounds // KEEP)}
    cfg = {**base, "sampler": {**keys, "step_size": "auto"}, "run": run}
    payload, draws, seconds = auto_step.run_config(folder / f"rtp-{out.parent.name}-{out.name}.toml", cfg, out)
    if draws is None:
        return {"rounds": rounds, **payload}
    return {"rounds": rounds, **criteria(draws, ref), "seconds": seconds, "step": payload["step"],
            "setup_rounds": payload["step"]["rounds"], "upload_bits_per_chain": payload["upload_bits_per_chain"]}


def main() -> None:
    args, path, records, prov = auto_step.start(__doc__, "rounds_to_posterior.json", PROBLEMS, SAMPLERS)
    records["meta"] = {"provenance": prov, "chains": CHAINS, "criteria": {"rhat": RHAT, "ess": ESS, "sd": SD}}
    for problem in args.problems:
        folder, base = auto_step.problem_config(args.out, problem)
        cached = args.out / f"reference-{problem}.npy"
        if not cached.is_file():
            np.save(cached, auto_step.nuts_reference(folder, base)["draws"])
        ref = np.load(cached)
        for label in args.samplers:
            runs, rounds = [], FIRST
            while rounds <= LAST:
                result = run_one(folder, base, SAMPLERS[label], rounds, args.out / problem / label.replace(" ", "_"), ref)
                runs.append(result)
                shown = result.get("refused") or ", ".join(f"{k} {result[k]:.3g}" for k in
                                                           ("max_rhat", "min_ess", "max_sd_deviation", "seconds"))
                print(f"{problem} {label} {rounds}: {shown}", flush=True)
                if "refused" in result or result["met"] or 2 * result["seconds"] > BUDGET:
                    break
                rounds *= 2
            records.setdefault(problem, {})[label] = {"runs": runs, "commit": prov["commit"]}
            path.write_text(json.dumps(records, indent=1, default=str))
    plot(records, args.out / "rounds_to_posterior.png")
    print("\n".join(table(records)))


def table(records: dict) -> list[str]:
    """The table of docs/flower.md, "Rounds to a posterior" (:mod:`fedmcmc.app.tables` renders it)."""
    return tables.TABLES["rounds_to_posterior"].render(records)


def plot(records: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    problems = [p for p in records if p != "meta"]
    fig, axes = plt.subplots(1, len(problems), figsize=(6 * len(problems), 4), squeeze=False)
    for ax, p in zip(axes[0], problems):
        for label, entry in records[p].items():
            runs = [r for r in entry["runs"] if "refused" not in r]
            if runs:
                ax.plot([r["rounds"] for r in runs], [r["max_sd_deviation"] for r in runs], marker="o", label=label)
        ax.axhline(SD, color="k", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlabel="rounds", ylabel="max |sd / NUTS sd - 1|", title=p)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
