"""The cost of privacy in accuracy (docs/privacy.md): QLSD# (8-bit QSGD) runs of one config per
data set, without [privacy] and with client-level budgets epsilon in EPSILONS (delta = 1e-5; the
clip chosen by the budget), each through `fedmcmc run`'s own code (fedmcmc.app.config.run).

    PYTHONPATH=src python benchmarks/privacy_cost.py OUT [breast-cancer|mnist5k ...]

Writes OUT/<set>-<eps>/ run folders and prints one markdown row per run: the data set, the budget,
the clip, the epsilon met at the client and record levels, and the held-out NLL, ECE and accuracy.
"""

import json
import sys
from pathlib import Path

from fedmcmc.app import config

EPSILONS = (None, 10.0, 3.0, 1.0)
SETS = {
    "breast-cancer": ('builtin = "breast-cancer"\npartition = { kind = "iid", num_clients = 10 }',
                      'name = "logistic"', 5000, 2500),
    "mnist5k": ('builtin = "mnist5k"\npartition = { kind = "iid", num_clients = 20 }',
                'name = "softmax"', 1500, 750),
}
TEMPLATE = """[data]
{data}
test_fraction = 0.2
seed = 0

[model]
{model}

[sampler]
name = "qlsd#"
step_size = "auto"
batch_fraction = 0.2
compression = {{ bits = 8 }}

[run]
seed = 0
num_chains = 2
num_iterations = {iterations}
burn_in = {burn_in}
thinning = 5
{privacy}"""


def run(out: Path, name: str, eps) -> str:
    data, model, iterations, burn_in = SETS[name]
    privacy = "" if eps is None else f"\n[privacy]\ndelta = 1e-5\nepsilon = {eps}\n"
    folder = out / f"{name}-{eps or 'none'}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder.with_suffix(".toml")
    path.write_text(TEMPLATE.format(data=data, model=model, iterations=iterations, burn_in=burn_in, privacy=privacy))
    config.run(path, folder, progress=False)
    summary = json.loads((folder / "summary.json").read_text())
    p, overall = summary["settings"].get("privacy"), summary["predictive"]["overall"]
    level = "-" if p is None else f"{p['client']['epsilon']:.3g} / {p['record']['epsilon']:.3g}"
    clip = "-" if p is None else f"{p['clip']:.3g}"
    return (f"| {name} | {eps or 'none'} | {clip} | {level} | {overall['nll']:.4f} | {overall['ece']:.4f} "
            f"| {overall['accuracy']:.4f} |")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or SETS:
        for eps in EPSILONS:
            print(run(out, name, eps), flush=True)
