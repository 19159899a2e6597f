"""The cost of privacy in accuracy (docs/privacy.md): QLSD# runs of one config per data set, without
[privacy] and with budgets epsilon in EPSILONS (delta = 1e-5; the bound chosen by the budget): at
the client level with 8-bit QSGD uploads (the clip C chosen), at the record level with uncompressed
uploads (the per-record clip C_r chosen), each through `fedmcmc run`'s own code
(fedmcmc.app.config.run).

    PYTHONPATH=src python benchmarks/privacy_cost.py OUT LEVEL [breast-cancer|mnist5k ...]

Writes OUT/<set>-<level>-<eps>/ run folders and prints one markdown row per run: the data set, the
level, the budget, the bound chosen, the epsilon met at the client and record levels, and the
held-out NLL, ECE and accuracy.
"""

import json
import sys
from pathlib import Path

from fedmcmc.app import config

EPSILONS = (None, 10.0, 3.0, 1.0)
#: data, model, step (given: "auto" reads the data without noise), iterations, burn-in; the steps are
#: QLSD#'s rule 2E / (L (1 + N/n - 1)) with L from the curvature (breast cancer: fedmcmc's "auto",
#: 2.15e-4; MNIST-5k: L <= lambda_max(X^T X) / 2 = 8.1e4, with L about half that)
SETS = {
    "breast-cancer": ('builtin = "breast-cancer"\npartition = { kind = "iid", num_clients = 10 }',
                      'name = "logistic"', 2e-4, 5000, 2500),
    "mnist5k": ('builtin = "mnist5k"\npartition = { kind = "iid", num_clients = 20 }',
                'name = "softmax"', 4e-7, 1500, 750),
}
TEMPLATE = """[data]
{data}
test_fraction = 0.2
seed = 0

[model]
{model}

[sampler]
name = "qlsd#"
step_size = {step}
batch_fraction = 0.2
compression = {compression}

[run]
seed = 0
num_chains = 2
num_iterations = {iterations}
burn_in = {burn_in}
thinning = 5
{privacy}"""


def run(out: Path, name: str, level: str, eps) -> str:
    data, model, step, iterations, burn_in = SETS[name]
    privacy = "" if eps is None else f'\n[privacy]\ndelta = 1e-5\nepsilon = {eps}\nlevel = "{level}"\n'
    folder = out / f"{name}-{level}-{eps or 'none'}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.with_suffix(".toml")
    compression = "{ bits = 8 }" if level == "client" else '"none"'
    path.write_text(TEMPLATE.format(data=data, model=model, step=step, iterations=iterations, burn_in=burn_in,
                                    privacy=privacy, compression=compression))
    config.run(path, folder, progress=False, overwrite=True)  # a measurement again replaces the last
    summary = json.loads((folder / "summary.json").read_text())
    p, overall = summary["settings"].get("privacy"), summary["predictive"]["overall"]
    met = "-" if p is None else " / ".join(f"{p[u]['epsilon']:.3g}" if "epsilon" in p[u] else "-"
                                           for u in ("client", "record"))
    bound = "-" if p is None else f"{p['clip' if level == 'client' else 'record_clip']:.3g}"
    return (f"| {name} | {level} | {eps or 'none'} | {bound} | {met} | {overall['nll']:.4f} | {overall['ece']:.4f} "
            f"| {overall['accuracy']:.4f} |")


if __name__ == "__main__":
    out, level = Path(sys.argv[1]), sys.argv[2]
    for name in sys.argv[3:] or SETS:
        for eps in EPSILONS:
            print(run(out, name, level, eps), flush=True)
