"""The tutorial's Flower section, timed: ``hospitals-flower.toml`` (``fedmcmc example
three-hospitals``) on a loopback deployment with TLS and SuperNode authentication, 3 SuperNodes,
each reading only its own file, as ``fedmcmc flower deploy`` runs it; then its draws against the
three criteria of ``benchmarks/rounds_to_posterior.py`` (NUTS reference of ``benchmarks/auto_step.py``)
and against ``fedmcmc run`` of the same file (the same samples, bit for bit).

    PYTHONPATH=src python benchmarks/flower_posterior.py OUT_DIR [--rounds N]

``--rounds N`` runs the config's first ``N`` rounds only (burn-in dropped, everything else
unchanged): the measured round latency then gives the full run's time (``full_run_seconds``),
and the criteria are not checked. Writes ``OUT_DIR/flower_posterior.json`` (wall seconds of the
whole deployment, its ask rounds, median round seconds, bits, the criteria, the commit and machine).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

import auto_step
import rounds_to_posterior

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "runtime"))
from test_flower_deploy import make_node_keys, make_tls  # noqa: E402  (the tests' throwaway credentials)

from fedmcmc.app import config, examples  # noqa: E402
from fedmcmc.app.flower import launch  # noqa: E402
from fedmcmc.runtime import io, provenance  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    out = args.out.resolve()
    folder = out / "inputs"
    examples.EXAMPLES["three-hospitals"](folder)
    path = folder / "hospitals-flower.toml"
    full = tomllib.loads(path.read_text())["run"]
    if args.rounds:
        text = re.sub(r"(?m)^num_iterations = \d+", f"num_iterations = {args.rounds}", path.read_text())
        path.write_text(re.sub(r"(?m)^burn_in = \d+", "burn_in = 0", text))
    run_dir = out / "flower"
    secrets = out / "credentials"
    secrets.mkdir(exist_ok=True)
    started = time.perf_counter()
    payload = launch.run_deploy(path, run_dir, overwrite=True, tls=make_tls(secrets),
                                auth_keys=make_node_keys(secrets, 3))
    wall = time.perf_counter() - started
    flower = payload["flower"]
    record = {"rounds": payload["config"]["run"]["num_iterations"], "wall_seconds": wall, "flower": flower,
              "upload_bits_per_chain": payload["upload_bits_per_chain"], "step": payload["step"],
              "provenance": provenance.record()}
    if args.rounds:
        per = flower["median_round_seconds"]
        record["full_run_seconds"] = wall + per * (full["num_iterations"] - args.rounds)
    layout = config.build(tomllib.loads(path.read_text()), folder).model.layout
    draws = io.read_draws(run_dir / "posterior.nc", layout)
    if not args.rounds:
        cached = out / "reference-hospitals.npy"
        if not cached.is_file():
            _, base = auto_step.problem_config(out, "hospitals")
            np.save(cached, auto_step.nuts_reference(folder, base)["draws"])
        record["criteria"] = rounds_to_posterior.criteria(draws, np.load(cached))
    config.run(path, out / "simulator", progress=False, overwrite=True)
    record["same_samples"] = bool(np.array_equal(io.read_draws(out / "simulator" / "posterior.nc", layout), draws))
    (out / "flower_posterior.json").write_text(json.dumps(record, indent=1, default=str))
    print(json.dumps({k: v for k, v in record.items() if k not in ("step", "provenance")}, indent=1, default=str))


if __name__ == "__main__":
    main()
