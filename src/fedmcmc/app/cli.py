"""Command line: ``fedmcmc list | reproduce NAME | run CONFIG.toml | predict RUN_DIR DATA.csv |
example NAME DIR | flower sim|deploy CONFIG.toml | supernode [--idle-poll S] ARGS | node-worker FOLDER |
bench``.

Exit codes: 0, finished; 2, input refused, with one line on stderr that names the problem and
the fix; 3, the run failed before finishing (it diverged to NaN/inf, or a worker process died or
failed), with one line on stderr that says what failed and what to do; 4, the run finished and
wrote its outputs, marked, but its draws failed the posterior check (:mod:`fedmcmc.app.posterior`),
which says why on stderr; 130, interrupted (a run continues with ``--resume``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as argparse does, but with our prefix
        self.print_usage(sys.stderr)
        sys.stderr.write(f"fedmcmc: error: {message}\n")
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fedmcmc", description="Bayesian federated learning by federated SG-MCMC")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser("list", help="list experiments, samplers and problems")
    r = sub.add_parser("reproduce", help="run a paper reproduction by name")
    r.add_argument("name")
    r.add_argument("--quick", action="store_true", help="a smaller version that finishes in minutes")
    r.add_argument("--out", type=Path, default=None, help="output folder (default results/NAME)")
    r.add_argument("--seed", type=int, default=None)
    _folder_options(r, "continue a run killed in the same --out folder")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a setting of the study, e.g. --set step_size=4.9e-6")
    r.add_argument("--no-progress", action="store_true")
    _workers_option(r)
    c = sub.add_parser("run", help="run a sampler described in a TOML file")
    c.add_argument("config", type=Path)
    c.add_argument("--out", type=Path, default=None, help="output folder (default results/CONFIG-NAME)")
    _folder_options(c, "continue a run killed in the same --out folder")
    c.add_argument("--no-progress", action="store_true")
    _workers_option(c)
    pr = sub.add_parser("predict", help="posterior predictive of a finished run on the rows of a CSV file")
    pr.add_argument("run_dir", type=Path, help="the folder of a finished `fedmcmc run` of [data] + [model]")
    pr.add_argument("data", type=Path, help="CSV file with a header and the run's feature columns (target optional)")
    pr.add_argument("--out", type=Path, default=None, help="output CSV (default RUN_DIR/predictions-DATA.csv)")
    pr.add_argument("--level", type=float, default=0.94, help="probability of a regression's interval (default 0.94)")
    from fedmcmc.app.examples import EXAMPLES

    e = sub.add_parser("example", help="write an example's input files (docs/tutorial.md)")
    e.add_argument("name", choices=list(EXAMPLES))
    e.add_argument("folder", type=Path)
    f = sub.add_parser("flower", help="run a config on Flower: simulation or local deployment engine")
    f.add_argument("engine", choices=["sim", "deploy"])
    f.add_argument("config", type=Path)
    f.add_argument("--clients", type=int, default=None, help="number of clients (SuperNodes); default: the config's")
    f.add_argument("--out", type=Path, default=None, help="output folder (default results/CONFIG-NAME-flower-ENGINE)")
    _folder_options(f, "continue a run whose server stopped, in the same --out")
    sub.add_parser("supernode", help="Flower's flower-supernode (all its arguments) with a 0.2 s idle poll "
                   "instead of its 3 s (--idle-poll S; docs/flower.md)", add_help=False)
    w = sub.add_parser("node-worker", help="keep a SuperNode's fedmcmc work in one long-lived process (docs/flower.md)")
    w.add_argument("folder", type=Path, help="the folder the SuperNode's node config names as `worker`")
    w.add_argument("--idle", type=float, default=3600.0, help="exit after this many seconds without a message "
                   "(default 3600)")
    b = sub.add_parser("bench", help="measure throughput against the NumPy reference")
    b.add_argument("--quick", action="store_true")
    b.add_argument("--flower", action="store_true", help="also time rounds on a loopback Flower deployment "
                   "against a trivial Flower app (docs/benchmarks.md)")
    b.add_argument("--out", type=Path, default=Path("results/bench"))
    _workers_option(b)
    return p


def _folder_options(parser, resume: str) -> None:
    """``--resume`` and ``--overwrite``: a folder that holds a run takes a new one only with either."""
    parser.add_argument("--resume", action="store_true", help=resume + " (refused if its settings differ)")
    parser.add_argument("--overwrite", action="store_true", help="replace the run in the --out folder (without it, "
                        "a folder that holds a run is refused)")


def _workers_option(parser) -> None:
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="worker processes to spread chains over (default: one per core, but 1 for reproduce --quick; "
                             "1: this process only)")


def _list() -> None:
    from fedmcmc.app import config, inputs, studies, problems
    from fedmcmc.data import DATASETS
    from fedmcmc.samplers import REGISTRY

    print("experiments (fedmcmc reproduce NAME [--quick]):")
    for name, study in sorted(studies.EXPERIMENTS.items()):
        print(f"  {name:24s} {study.SUMMARY}")
    print("samplers ([sampler] name in a run config, and its keys; * must be set):")
    for name, entry in REGISTRY.items():
        keys = ", ".join(key + "*" * required for key, required in config.sampler_keys(name).items())
        print(f"  {name:24s} {entry.summary}\n  {'':24s} keys: {keys}")
    print("problems ([problem] name in a run config):")
    for name in problems.PROBLEMS:
        print(f"  {name:24s} {problems.summary(name)}")
    print('models ([model] name with your [data], or "package.module:function"; and their keys):')
    for name, (builder, task) in inputs.MODELS.items():
        print(f"  {name:24s} {task}; keys: {', '.join(sorted(inputs.builder_keys(builder)[0]))}, temperature")
    print("data sets ([data] builtin = NAME, with a partition):")
    for name, entry in DATASETS.items():
        print(f"  {name:24s} {entry.description}")


def _main(args) -> int:
    if args.command == "list":
        _list()
        return 0
    if args.command in ("reproduce", "run", "bench"):
        import fedmcmc

        quick = args.command == "reproduce" and args.quick  # many short runs: compiling once pays more
        fedmcmc.tune_cpu(1 if args.workers is None and quick else args.workers)
    if args.command == "reproduce":
        from fedmcmc.app import studies
        from fedmcmc.app.studies import runner

        study = studies.get(args.name)
        out = args.out or Path("results") / (args.name + ("-quick" if args.quick else ""))
        payload = runner.run_study(study, out, quick=args.quick, seed=args.seed,
                                   settings=runner.overrides(study, args.set), resume=args.resume,
                                   overwrite=args.overwrite, progress=not args.no_progress)
        print(f"wrote {out}/results.json, posterior draws (.nc) and figures ({payload['wall_seconds']:.0f} s)")
        return 0
    if args.command == "run":
        from fedmcmc.app import config

        out = args.out or Path("results") / args.config.stem
        payload = config.run(args.config, out, resume=args.resume, progress=not args.no_progress,
                             overwrite=args.overwrite)
        print(f"wrote {out}/results.json and {out}/posterior.nc; {_accuracy(payload)}")
        return _exit_code(payload)
    if args.command == "predict":
        from fedmcmc.app.predict_rows import predict

        path = predict(args.run_dir, args.data, args.out, level=args.level)
        print(f"wrote {path}")
        return 0
    if args.command == "example":
        from fedmcmc.app.examples import EXAMPLES

        written = EXAMPLES[args.name](args.folder)
        print("wrote " + ", ".join(str(path) for path in written))
        return 0
    if args.command == "flower":
        from fedmcmc.app.flower import launch

        out = args.out or Path("results") / f"{args.config.stem}-flower-{args.engine}"
        run = launch.run_sim if args.engine == "sim" else launch.run_deploy
        payload = run(args.config, out, clients=args.clients, resume=args.resume, overwrite=args.overwrite)
        rounds = payload.get("flower")  # not written under [privacy] release = "draws"
        print(f"wrote {out}/results.json and {out}/posterior.nc ({args.engine} engine"
              + (f", {rounds['median_round_seconds']:.2f} s per round" if rounds else "") + f"); {_accuracy(payload)}")
        return _exit_code(payload)
    if args.command == "node-worker":
        import logging

        from fedmcmc.app.flower import node_worker

        logging.basicConfig(format="%(asctime)s %(levelname)s %(message)s")
        logging.getLogger("fedmcmc").setLevel(logging.INFO)
        node_worker.serve(args.folder, args.idle)
        return 0
    if args.command == "bench":
        from fedmcmc.app.bench import run as run_bench

        payload = run_bench(args.out, quick=args.quick, flower=args.flower)
        print(f"wrote {args.out}/bench.json: speedup_vs_numpy {payload['speedup_vs_numpy']:.1f}, "
              f"federation_overhead {payload['federation_overhead']:.2f}, "
              f"fa_hmc_overhead {payload['fa_hmc_overhead']:.2f}"
              + (f", flower_round_ratio {payload['flower_round_ratio']:.2f}, flower_client_process_ratio "
                 f"{payload['flower_client_process_ratio']:.2f}" if args.flower else ""))
        return 0
    raise AssertionError(args.command)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["supernode"]:  # every other argument is flower-supernode's
        from fedmcmc.app.flower import supernode

        return supernode.main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command in ("flower", "node-worker"):  # one JAX per node process: on a GPU each would take most of its memory
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    if args.command != "list":  # XLA on one intra-op thread, as in every fedmcmc process (fedmcmc.runtime.cpu)
        from fedmcmc.core.cache import keep_compiled_programs
        from fedmcmc.runtime.cpu import one_thread_xla

        one_thread_xla()
        if args.command != "node-worker":  # a node keeps its client programs in programs/ (app/flower/replies.py)
            keep_compiled_programs()  # in the user's cache folder, unless JAX has one
    from fedmcmc.runtime.records import DivergenceError, step_advice
    from fedmcmc.runtime.workers import WorkerError

    try:
        return _main(args)
    except DivergenceError as err:
        step = err.step or {"value": _given_step(args), "rule": "given"}
        sys.stderr.write(f"fedmcmc: error: the run diverged (NaN/inf) by iteration {err.iteration}: "
                         f"{step_advice(step)}\n")
        return 3
    except (ValueError, FileNotFoundError, KeyError) as err:
        message = err.args[0] if err.args else repr(err)
        sys.stderr.write(f"fedmcmc: error: {message}\n")
        return 2
    except WorkerError as err:
        sys.stderr.write(f"fedmcmc: error: {err}; rerun with --resume, or with --workers 1 "
                         "to run every chain in this process\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write("fedmcmc: interrupted; rerun with --resume to continue from the last chunk\n")
        return 130


def _exit_code(payload: dict) -> int:
    """4 when the posterior check failed (its warning is already printed), else 0."""
    return 4 if payload.get("posterior_check", {}).get("passed") is False else 0


def _accuracy(payload: dict) -> str:
    """The run's errors against the exact posterior (a ``[problem]``), else its draw count; and
    how many draws ``posterior.nc`` stores when it stores fewer."""
    if "posterior_mean_error" not in payload:
        line = f"{payload['num_draws']} draws per chain"
    else:
        line = (f"posterior mean error {payload['posterior_mean_error']:.3g}, "
                f"variance ratio {payload['posterior_variance_ratio']:.3g}")
    every = payload["stored_every"]
    if every == 1:
        return line
    stored = (f", {payload['num_stored_draws']} stored" if "posterior_mean_error" not in payload
              else f"; {payload['num_stored_draws']} draws per chain stored")
    return line + f"{stored} in posterior.nc (every {_ordinal(every)}; [run] max_stored_draws)"


def _ordinal(n: int) -> str:
    """``2nd``, ``3rd``, ``4th``, ``11th``, ``21st``, ..."""
    suffix = "th" if n % 100 in (11, 12, 13) else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _given_step(args):
    """The step size the config or study sets, if a number (None otherwise)."""
    try:
        if args.command in ("run", "flower"):
            from fedmcmc.app import config

            return float(config.load(args.config)["sampler"]["step_size"])
        if args.command == "reproduce":
            from fedmcmc.app import studies
            from fedmcmc.app.studies import runner

            study = studies.get(args.name)
            return float(runner.resolve(study, args.quick, None, runner.overrides(study, args.set))["step_size"])
    except Exception:  # the hint is optional; the error itself is already known
        return None
    return None


if __name__ == "__main__":
    raise SystemExit(main())
