"""The tables of docs/reproductions.md and docs/benchmarks.md, generated from the results files.

A generated table sits between two marker comments in its page::

    <!-- table: qlsd_logistic, from docs/figures/qlsd_logistic.json -->
    | method | ... |
    <!-- /table -->

and :func:`update` rewrites what is between them, and the opening marker, from :data:`TABLES`:
one entry per table name, holding the results files it reads (paths from the repository's root,
each the ``results.json`` of a run, or what a benchmark wrote) and the function that renders
the table's Markdown lines from their contents. The prose around a table is the page's own.
``tests/app/test_tables.py`` checks that every marked table is what its entry renders from the
committed files.

Regenerate the tables with (from the repository's root; ``--check`` only reports stale ones)::

    python -m fedmcmc.app.tables
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

__all__ = ["PAGES", "TABLES", "Table", "render", "update", "marked", "main", "sci", "pm", "comma"]

#: The pages whose marked tables are generated, from the repository's root.
PAGES = ("docs/reproductions.md", "docs/benchmarks.md", "docs/flower.md")
COMMAND = "python -m fedmcmc.app.tables"

_MARKED = re.compile(r"<!-- table: ([\w-]+)[^\n]*-->\n(.*?)<!-- /table -->", re.S)


class Table(NamedTuple):
    """One generated table: the results files it reads and the function that renders it."""

    sources: tuple[str, ...]
    """Paths of the results files, from the repository's root."""
    render: Callable[..., list[str]]
    """The contents of the sources (JSON, in order) -> the table's Markdown lines."""


#: Table name -> its sources and renderer (filled by :func:`_table`).
TABLES: dict[str, Table] = {}


def _table(name: str, *sources: str):
    def register(fn):
        TABLES[name] = Table(tuple(sources), fn)
        return fn
    return register


# --- number formats -------------------------------------------------------------------------

def sci(x: float, sig: int = 2) -> str:
    """A number in scientific notation, as the pages write it.

    Parameters
    ----------
    x
        The number.
    sig
        Significant digits.

    Returns
    -------
    str
        For example ``2.78e-2`` (no ``+`` and no leading zero in the exponent).
    """
    mantissa, exponent = f"{x:.{sig - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def pm(x: float, se: float, sig: int = 2, sep: str = "±") -> str:
    """A value and its standard error, both in the exponent of the value.

    Parameters
    ----------
    x, se
        The value and its standard error.
    sig
        Significant digits of ``x``; ``se`` gets as many decimals.
    sep
        Between the two.

    Returns
    -------
    str
        For example ``5.2e-5 ± 1.4e-5`` or ``2.9e-2 ± 0.2e-2``.
    """
    exponent = int(sci(x, sig).split("e")[1])
    scale = 10.0 ** exponent
    return f"{x / scale:.{sig - 1}f}e{exponent} {sep} {se / scale:.{sig - 1}f}e{exponent}"


def comma(x: float) -> str:
    """A number rounded to an integer, with thousands separators.

    Parameters
    ----------
    x
        The number.

    Returns
    -------
    str
        For example ``1,254,400``.
    """
    return f"{round(x):,}"


def _md(header: Sequence[str], rows) -> list[str]:
    """A table in the ``|---|---|`` style (an empty cell is ``| |``)."""
    def line(cells):
        return "| " + " | ".join(cells) + " |"
    return [line(header), "|" + "---|" * len(header)] + \
           [line(row).replace("|  |", "| |").replace("|  |", "| |") for row in rows]


def _md_spaced(header: Sequence[str], rows) -> list[str]:
    """A table in the ``| --- | --- |`` style."""
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + \
           ["| " + " | ".join(row) + " |" for row in rows]


# --- the tables -----------------------------------------------------------------------------

def _toy_sig(method: str, star: int, sharp: int) -> int:
    return star if "*" in method else sharp


@_table("qlsd_toy_gaussian", "docs/figures/qlsd_toy_gaussian_gamma4.9e-4.json")
def _qlsd_toy_gaussian(results: dict) -> list[str]:
    rows = [(m, sci(r["mse"], _toy_sig(m, 4, 3)), sci(r["bias2"], _toy_sig(m, 4, 3)), sci(r["variance"], 2),
             sci(r["mse_vs_ula_stationary"], _toy_sig(m, 2, 3)), comma(r["bits_per_iteration"]),
             comma(r["bits_per_iteration_bound"])) for m, r in results["methods"].items()]
    return _md(("method", "MSE vs exact posterior", "bias^2", "variance over chains",
                "MSE vs the stationary law of ULA", "bits / round (ours, encoded)",
                "bits / round (QSGD bound used by the paper)"), rows)


@_table("qlsd_toy_gaussian_small_step", "docs/figures/qlsd_toy_gaussian_gamma4.9e-6.json")
def _qlsd_toy_gaussian_small_step(results: dict) -> list[str]:
    rows = [(m, sci(r["mse"], _toy_sig(m, 4, 3)), sci(r["bias2"], 2), sci(r["variance"], 3),
             comma(r["bits_per_iteration"])) for m, r in results["methods"].items()]
    return _md(("method", "MSE vs exact posterior", "bias^2", "variance over chains", "bits / round"), rows)


@_table("qlsd_logistic", "docs/figures/qlsd_logistic.json")
def _qlsd_logistic(results: dict) -> list[str]:
    def cell(value, fmt):
        return "–" if value is None else fmt(value)

    rows = []
    for method, r in results["methods"].items():
        reference = method == "LSD++"
        paper = results["paper"].get(method, {})
        rows.append((method, cell(paper.get("hpd_error_vs_lsd"), sci),
                     "0" if reference else pm(r["hpd_error_vs_lsd"], r["hpd_error_vs_lsd_se"]),
                     sci(r["hpd_error_vs_lsd_unpaired"]), pm(r["hpd_error_vs_nuts"], r["hpd_error_vs_nuts_se"]),
                     "1" if reference else cell(paper.get("relative_efficiency"), str),
                     cell(r["relative_efficiency_paper_formula"], lambda v: f"{v:.2f}"),
                     "1" if reference else f"{r['relative_efficiency_encoded']:#.3g}".rstrip("."),
                     comma(r["bits_per_iteration"]), f"{r['test_accuracy']:.3f}"))
    return _md(("method", "HPD error vs LSD++, paper (FEMNIST)", "ours, paired ± s.e.", "ours, independent chains",
                "ours vs NUTS ± s.e.", "rel. efficiency, paper", "ours, paper's formula", "ours, encoded bits",
                "bits / iteration", "test accuracy"), rows)


def _minus(text: str) -> str:
    return text.replace("-", "−")


@_table("qlsd_memory", "docs/figures/qlsd_memory.json")
def _qlsd_memory(results: dict) -> list[str]:
    def label(method):
        return "LSD++ (no compression)" if method == "LSD++" else method.replace("s=", "s = ")

    def relative(x, se):
        digits = 3 if x < 1 else 2
        return f"{x:.{digits}f} ± {se:.{digits}f}"

    def ratios(values):
        digits = 3 if max(values) < 1.1 else 2
        return ", ".join(f"{v:.{digits}f}" for v in values)

    rows = [(label(m), pm(r["variance_error"], r["variance_error_se"], 3),
             relative(r["relative_variance_error"], r["relative_variance_error_se"]),
             ratios(r["variance_ratio_to_reference"]), comma(r["bits_per_iteration"]))
            for m, r in results["methods"].items()]
    return _md(("method", "‖v − v_MALA‖ at K = 100,000 (± s.e. over 10 chains)", "relative error",
                "variance / MALA (theta_1, theta_2)", "bits / round (encoded)"), rows)


@_table("qlsd_big_data", "docs/figures/qlsd_big_data.json")
def _qlsd_big_data(results: dict) -> list[str]:
    methods = results["methods"]
    sharp, star, pp = methods["QLSD#"], methods["QLSD*"], methods["QLSD++"]
    rows = [(comma(a["N"]), sci(a["step_size"]), f"{a['bias']:.3f} ± {a['bias_se']:.3f}", f"{a['relative_bias']:.3g}",
             pm(b["bias"], b["bias_se"], 3), f"{b['relative_bias']:.3g}", pm(c["bias"], c["bias_se"], 3),
             f"{c['relative_bias']:.3g}") for a, b, c in zip(sharp, star, pp)]
    fits = results["fits"]
    slope = [_minus(f"{fits[m]['slope_vs_N']:.3f} ± {fits[m]['slope_vs_N_se']:.3f}") for m in ("QLSD#", "QLSD*", "QLSD++")]
    rows.append(("log-log slope of b_2 against N", "", slope[0], "", slope[1], "", slope[2], ""))
    return _md(("N", "gamma", "QLSD# b_2", "QLSD# b_2 / (d/N)", "QLSD* b_2", "QLSD* b_2 / (d/N)", "QLSD++ b_2",
                "QLSD++ b_2 / (d/N)"), rows)


@_table("cgdsgld_gaussian_mean", "docs/figures/cgdsgld_gaussian_mean.json")
def _cgdsgld_gaussian_mean(results: dict) -> list[str]:
    rows = [(k, pm(r["DSGLD"]["mse"], r["DSGLD"]["mse_se"], 3), pm(r["CG-DSGLD"]["mse"], r["CG-DSGLD"]["mse_se"], 3),
             f"{r['DSGLD']['sample_variance']:.2g}", f"{r['CG-DSGLD']['sample_variance']:.2g}")
            for k, r in results["local_updates"].items()]
    return _md(("local updates per visit", "DSGLD MSE", "CG-DSGLD MSE", "DSGLD sample variance",
                "CG-DSGLD sample variance"), rows)


@_table("fahmc_local_steps", "docs/figures/fahmc_local_steps.json")
def _fahmc_local_steps(results: dict) -> list[str]:
    runs = results["local_steps"]
    levels = list(next(iter(runs.values()))["rounds_to_reach"])
    best = {eps: min(float(r["rounds_to_reach"][eps]) for r in runs.values()) for eps in levels}

    def reached(eps, value):
        if not math.isfinite(float(value)):  # "inf": the online ME never reached eps
            return "not reached"
        return f"**{value:,.0f}**" if value == best[eps] else f"{value:,.0f}"

    rows = [(t, comma(r["rounds"]), *(reached(eps, r["rounds_to_reach"][eps]) for eps in levels),
             f"{r['final_me']:.3f}") for t, r in runs.items()]
    return _md(("T", "rounds run", *(f"R_{eps}" for eps in levels), "ME at the last round"), rows)


#: The step sizes and quantiser levels of the ``qlsd-omega`` table (the file holds more levels).
OMEGA_STEPS = ("0.00049", "4.9e-05", "4.9e-06")
OMEGA_LEVELS = (1, 2, 4, 8, 16, 256)


@_table("qlsd_omega", "docs/figures/qlsd_omega.json")
def _qlsd_omega(results: dict) -> list[str]:
    forms = [results["closed_form"][g] for g in OMEGA_STEPS]
    by_level = [{r["levels"]: r for r in form["rows"]} for form in forms]

    def delta(x):
        return f"{x:.3g}" if x >= 0.1 else sci(x, 3)

    rows = []
    for s in OMEGA_LEVELS:
        first = by_level[0][s]
        rows.append((str(s), f"{first['omega']:.3g}", f"{first['kappa_bar'] / first['omega']:.3g}",
                     *(delta(level[s]["relative_delta"]) for level in by_level),
                     *(sci(level[s]["norm_bias2"]) for level in by_level)))
    rows.append(("LSD*", "0", "", "0", "0", "0", *(sci(form["lsd_norm_bias2"], 3) for form in forms)))
    return _md(("s", "omega", "kappa_bar / omega", "Delta/(d/N), gamma = 4.9e-4", "4.9e-5", "4.9e-6",
                "bias² of E‖theta‖, 4.9e-4", "4.9e-5", "4.9e-6"), rows)


#: The dimensions of the ``fahmc-dimension`` table (the file holds all 21).
DIMENSION_ROWS = ("2", "50", "100", "200", "500", "750", "1000")


@_table("fahmc_dimension", "docs/figures/fahmc_dimension.json")
def _fahmc_dimension(results: dict) -> list[str]:
    ratio = results["fit"]["exact"]["ratio"]
    rows = [(d, f"{r['step_size']:.4f}", comma(r["exact_rounds"]), comma(r["rounds"]) if "rounds" in r else "",
             comma(round(ratio[d], -3))) for d, r in ((d, results["dims"][d]) for d in DIMENSION_ROWS)]
    return _md(("d", "eta", "t_eps/T exact", "sampled (200 runs)", "(t_eps/T)^2 / d, exact"), rows)


def _mean_se(x: float, se: float) -> str:
    """``x ± se`` to the decimals that show ``se`` to one or two digits: ``7.2 ± 1.6``, ``229 ± 59``."""
    digits = 0 if se >= 10 else 1 if se >= 1 else -math.floor(math.log10(se))
    return f"{x:,.{digits}f} ± {se:,.{digits}f}"


@_table("cgdsgld_linear_regression", "docs/figures/cgdsgld_linear_regression.json")
def _cgdsgld_linear_regression(results: dict) -> list[str]:
    rows = []
    for name, data in results["datasets"].items():
        large = data["exact_posterior_test_mse"]["mean"] > 1000  # diabetes: the target's units are larger

        def mse(x):
            return f"{x:.0f}" if large else f"{x:.2f}"

        def var(x):
            return comma(x) if large else f"{x:.1f}"

        exact = data["exact_posterior_test_mse"]
        rows.append((name, "-", "exact posterior", mse(exact["mean"]), var(exact["var"]), "0"))
        for updates, methods in data["local_updates"].items():
            rows += [(name, updates, method, mse(r["final_test_mse_mean"]), var(r["final_test_mse_var"]),
                      _mean_se(r["excess_over_exact_mean"], r["excess_over_exact_se"])) for method, r in methods.items()]
    return _md(("data", "local updates", "method", "test MSE (mean over seeds)", "variance over seeds",
                "excess over exact"), rows)


def _bold_if(text: str, bold: bool) -> str:
    return f"**{text}**" if bold else text


def _fahmc_vs_fald_columns(results: dict, noise: str):
    """Per step size, FA-HMC's and FA-LD's runs and the gain, and each method's best step size."""
    runs = results["by_step_size"][noise]
    best = {m: min(runs[m], key=lambda eta: runs[m][eta]["me"]) for m in ("FA-HMC", "FA-LD")}
    return runs, results["summary"][noise]["gain_by_step_size"], best


@_table("fahmc_vs_fald", "docs/figures/fahmc_vs_fald.json")
def _fahmc_vs_fald(results: dict) -> list[str]:
    def me(r, bold):
        return _bold_if(f"{r['me']:.3f} +- {r['me_se']:.1g}", bold)

    def gain(g):
        return f"{100 * g['relative']:.0f}% +- {100 * g['se']:.1f}%"

    columns = [_fahmc_vs_fald_columns(results, noise) for noise in ("exact", "noisy")]
    rows = []
    for eta, hmc in columns[0][0]["FA-HMC"].items():
        cells = [eta, str(hmc["num_leapfrog"])]
        for runs, gains, best in columns:
            cells += [me(runs["FA-HMC"][eta], best["FA-HMC"] == eta), me(runs["FA-LD"][eta], best["FA-LD"] == eta),
                      gain(gains[eta])]
        rows.append(cells)
    return _md(("eta", "K", "FA-HMC exact", "FA-LD exact", "gain", "FA-HMC noisy", "FA-LD noisy", "gain"), rows)


@_table("fahmc_vs_fald_d10", "docs/figures/fahmc_vs_fald_d10.json")
def _fahmc_vs_fald_d10(results: dict) -> list[str]:
    def me(r, bold):
        digits = 4 if bold else 3
        return _bold_if(f"{r['me']:.{digits}f} +- {r['me_se']:.{digits}f}", bold)

    runs, gains, best = _fahmc_vs_fald_columns(results, "noisy")
    rows = [(eta, str(hmc["num_leapfrog"]), me(hmc, best["FA-HMC"] == eta), me(runs["FA-LD"][eta], best["FA-LD"] == eta),
             f"{100 * gains[eta]['relative']:.0f}% +- {100 * gains[eta]['se']:.0f}%") for eta, hmc in runs["FA-HMC"].items()]
    return _md(("eta", "K", "FA-HMC", "FA-LD", "gain"), rows)


def _step(x: float) -> str:
    """A step size as the pages write it: ``1.2e-3``, ``6e-4``."""
    return sci(x).replace(".0e", "e")


_METRICS = ("accuracy", "brier", "ece", "nll")


def _fahmc_bma_rows(results: dict, spread: bool, label: Callable[[dict], str]) -> list[tuple[str, ...]]:
    """The rows of the FA-HMC Fashion-MNIST tables: per (K, T) the pilot, the BMA's metrics after
    the last round (bold: the best of a sweep, ``results["groups"]``) and the rounds to accuracies."""
    runs = results["runs"]
    best = set()
    for group in results["groups"].values():
        for metric in _METRICS:
            pick = max if metric == "accuracy" else min
            best.add((pick(group, key=lambda name: runs[name]["final"][metric]["mean"]), metric))

    def metric(name, key):
        final = runs[name]["final"][key]
        text = f"{final['mean']:.4f} +- {final['sd']:.4f}" if spread else f"{final['mean']:.4f}"
        return _bold_if(text, (name, key) in best)

    def rounds(value):
        return f"{float(value):.0f}" if math.isfinite(float(value)) else "-"

    rows = []
    for name, r in runs.items():
        pilot = " / ".join(f"{v:.2f}" for v in r["pilot_nll"].values())
        rows.append((label(r), str(r["local_steps"]), f"{_step(r['step_size'])} ({pilot})",
                     *(metric(name, key) for key in _METRICS),
                     " / ".join(rounds(v) for v in r["rounds_to_accuracy"].values())))
    return rows


def _pilots(results: dict) -> str:
    return " / ".join(_step(float(eta)) for eta in next(iter(results["runs"].values()))["pilot_nll"])


def _accuracies(results: dict) -> str:
    return " / ".join(f"{float(a):.2f}" for a in next(iter(results["runs"].values()))["rounds_to_accuracy"])


@_table("fahmc_logistic", "docs/figures/fahmc_logistic.json")
def _fahmc_logistic(results: dict) -> list[str]:
    rows = _fahmc_bma_rows(results, True, lambda r: str(r["num_leapfrog"]))
    return _md(("K", "T", f"eta (pilot NLL at {_pilots(results)})", "accuracy", "Brier", "ECE", "NLL",
                f"rounds to accuracy {_accuracies(results)}"), rows)


@_table("fahmc_mlp", "docs/figures/fahmc_mlp.json")
def _fahmc_mlp(results: dict) -> list[str]:
    rows = _fahmc_bma_rows(results, False, lambda r: "1 (FA-LD)" if r["num_leapfrog"] == 1 else str(r["num_leapfrog"]))
    return _md(("K", "T", f"eta (pilot NLL at {_pilots(results)})", "accuracy", "Brier", "ECE", "NLL",
                f"rounds to accuracy {_accuracies(results)}"), rows)


@_table("qlsd_bnn_heterogeneous", "docs/figures/qlsd_bnn_heterogeneous.json")
def _qlsd_bnn_heterogeneous(results: dict) -> list[str]:
    papers = results["paper_table_s2"]
    rows = []
    for method, r in results["methods"].items():
        paper = papers.get(method.replace(" (warm)", ""))  # the warm start is FSGLD's row of the paper
        acc, ece, brier, nll = (f"{paper[0]:.1f}", f"{paper[1]:#.3g}", f"{paper[2]:.2f}", f"{paper[3]:.2f}") \
            if paper else ("—",) * 4
        gradients = f"{r['point_gradients_per_iteration']:.0f} ({r['point_gradients_total'] / 1e6:.2f} M"
        if r["warm_start_point_gradients"]:
            gradients += f", incl. {r['warm_start_point_gradients'] / 1e6:.2f} M warm start"
        upload = f"{r['upload_bits_per_chain'] / 1e6:.0f}"
        if r["setup_bits_per_chain"]:
            upload += f" (incl. {r['setup_bits_per_chain'] / 1e6:.0f} setup)"
        rows.append(("DSGLD (diagnostic)" if method == "DSGLD" else method, acc, f"{100 * r['accuracy']:.1f}", ece,
                     f"{100 * r['ece']:.2f}", brier, f"{100 * r['brier']:.1f}", nll, f"{100 * r['nll']:.1f}",
                     f"{r['ood_auroc']:.3f}", gradients + ")", upload))
    return _md(("method", "paper acc (%)", "ours acc (%)", "paper 100 ECE", "ours 100 ECE", "paper 100 Brier",
                "ours 100 Brier", "paper 100 NLL", "ours 100 NLL", "ours OOD AUROC",
                "point gradients / iteration (total)", "upload Mbit"), rows)


#: The ``cgdsgld-mlp`` table's method labels, and the cells it sets in bold (the collapse of
#: DSGLD on non-IID shards, the paper's and ours).
MLP_LABELS = {"SGLD": "SGLD (centralised)", "DSGLD": "DSGLD", "FSGLD": "FSGLD (CG-DSGLD)"}
MLP_BOLD = ("Beta(0.5, 0.5)", "DSGLD")


@_table("cgdsgld_mlp", "docs/figures/cgdsgld_mlp.json")
def _cgdsgld_mlp(results: dict) -> list[str]:
    def cell(x):
        return f"{x['mean']:.3f} ± {x['se']:.3f}"

    rows = []
    for shares, partition in results["partitions"].items():
        for method, r in partition["methods"].items():
            bold = (shares, method) == MLP_BOLD
            paper = results["paper_table_1"].get(shares, {}).get(method)
            if paper:
                (train, train_sd), (test, test_sd) = paper["train"], paper["test"]
                paper_cell = f"{train:.2f} ± {train_sd:g} / {_bold_if(f'{test:.2f} ± {test_sd:g}', bold)}"
            else:
                paper_cell = "—"
            acc = r["test_accuracy"]
            rows.append((shares, MLP_LABELS[method], paper_cell, cell(r["train_log_likelihood_per_draw"]),
                         _bold_if(cell(r["test_log_likelihood_per_draw"]), bold), cell(r["train_log_likelihood"]),
                         cell(r["test_log_likelihood"]), cell(acc), f"{acc['diverged']}/{len(acc['per_seed'])}"))
    return _md(("label shares", "method", "paper train / test (mean ± s.d., 10 runs)", "ours train, per draw",
                "ours test, per draw", "ours train, BMA", "ours test, BMA", "ours test accuracy (BMA)", "diverged"),
               rows)


@_table("fahmc_local_steps_law", "docs/figures/fahmc_local_steps.json")
def _fahmc_local_steps_law(results: dict) -> list[str]:
    law = results["gaussian_exact"]

    def rounds(value):
        return comma(float(value)) if math.isfinite(float(value)) else "not reached"

    def w2(x):
        return sci(x) if x < 0.01 else f"{x:#.2g}"

    return _md(("T (leapfrog steps)", *(comma(int(t)) for t in law)),
               [("R_0.1", *(rounds(r["rounds_to_eps"]) for r in law.values())),
                ("stationary W2^2", *(w2(r["stationary_w2_squared"]) for r in law.values()))])


#: The rows and columns of the "No tuning" table (``benchmarks/auto_step.py``'s ``SAMPLERS`` and
#: ``PROBLEMS``).
AUTO_STEP_SAMPLERS = ("sgld", "psgld", "qlsd#", "qlsd*", "lsd*", "qlsd++", "lsd++", "fa-hmc", "fa-ld", "dsgld",
                      "cg-dsgld taylor", "cg-dsgld laplace", "cg-dsgld sgld", "dg-sgld", "qlsd++ whiten = false")
AUTO_STEP_PROBLEMS = ("hospitals", "banks", "births", "births-raw", "diamonds")


def auto_step_cell(r: dict | None) -> str:
    """A cell of the "No tuning" table.

    Parameters
    ----------
    r
        One record of ``auto_step.json`` (a problem and a sampler), or None when not run.

    Returns
    -------
    str
        W1/sd, with the run's own verdict when it did not pass its posterior check; ``refused`` or
        ``diverged``; empty when not run.
    """
    if r is None:
        return ""
    if "refused" in r:
        return "diverged" if r["refused"].startswith("DivergenceError") else "refused"
    verdict = {True: "", False: " (check failed)", None: f" (R-hat {r['max_rhat']:.2f})"}[r["posterior_check"]]
    return f"{r['w1_over_sd']:.3f}{verdict}"


@_table("auto_step", "docs/figures/auto_step.json")
def _auto_step(records: dict) -> list[str]:
    problems = [p for p in AUTO_STEP_PROBLEMS if p in records]
    rows = [(label, *(auto_step_cell(records[p].get(label)) for p in problems)) for label in AUTO_STEP_SAMPLERS]
    return _md_spaced(("sampler", *problems), rows)


def _reached(entry: dict) -> str:
    """A cell of the rounds-to-a-posterior table: the rounds of the first run that met the three
    criteria (and the automatic step's setup rounds), or how far the last run got."""
    hit = next((r for r in entry["runs"] if r.get("met")), None)
    if hit is not None:
        return f"{hit['rounds']:,} + {hit['setup_rounds']}"
    last = entry["runs"][-1]
    if "refused" in last:
        return "refused"
    return (f"> {last['rounds']:,} (R-hat {last['max_rhat']:.2f}, ESS {last['min_ess']:.0f}, "
            f"sd {last['max_sd_deviation']:.0%} off)")


def _reached_bits(entry: dict) -> str:
    hit = next((r for r in entry["runs"] if r.get("met")), None)
    return "" if hit is None else sci(hit["upload_bits_per_chain"])


@_table("rounds_to_posterior", "docs/figures/rounds_to_posterior.json")
def _rounds_to_posterior(records: dict) -> list[str]:
    problems = [p for p in records if p != "meta"]
    labels = list(dict.fromkeys(label for p in problems for label in records[p]))
    header = ["sampler"] + [f"{p}: {what}" for p in problems for what in ("rounds + setup", "upload bits per chain")]
    rows = [(label, *(cell for p in problems for cell in (
        (_reached(records[p][label]), _reached_bits(records[p][label])) if label in records[p] else ("", ""))))
        for label in labels]
    return _md(header, rows)


# --- benchmarks (docs/benchmarks.md, from `fedmcmc bench --flower`'s bench.json) ----------------

BENCH = "docs/figures/bench.json"


def _rate(x: float) -> str:
    return comma(x) if x >= 100 else f"{x:.1f}"


def _target(label: str, key: str, measured: float, target: float, at_most: bool, shown: str | None = None):
    """A row of the targets table: ``measured`` against ``target`` (``<=`` if ``at_most``, else ``>=``)."""
    met = measured <= target if at_most else measured >= target
    return (label, f"`{key}`", f"{'<=' if at_most else '>='} {target:g}", shown or f"{measured:.2f}",
            "yes" if met else "no")


@_table("bench_targets", BENCH)
def _bench_targets(b: dict) -> list[str]:
    pad, scale, dev = b["no_padding_tax"], b["chains_scale"], b["devices"]
    least = scale["least_gain"]
    rows = [_target("toy bench", "speedup_vs_numpy", b["speedup_vs_numpy"], b["speedup_vs_numpy_target"], False,
                    f"{b['speedup_vs_numpy']:.1f}"),
            _target("no padding tax", "no_padding_tax.padding_overhead_full_batch", pad["padding_overhead_full_batch"],
                    pad["target"], True),
            # the bench writes this target as text, "every gain >= 0.8 x qlsd*'s"
            _target("chains scale", "chains_scale.least_gain.relative_to_reference", least["relative_to_reference"],
                    float(scale["target"].split(">=")[1].split()[0]), False,
                    f"{least['relative_to_reference']:.2f} ({least['sampler']})")]
    rows += [_target(f"large model ({model})", f"federation_overhead_large.{model}.ratio", r["ratio"], r["target"], True)
             for model, r in b["federation_overhead_large"].items()]
    rows += [_target(label, key, b[key], b[key + "_target"], True)
             for key, label in (("flower_round_ratio", "deployment round below Flower's floor"),
                                ("flower_client_process_ratio", "lean client process")) if key in b]
    if dev["spread_speedup"] is not None:
        rows.append(_target("accelerators", "devices.spread_speedup", dev["spread_speedup"],
                            dev["spread_speedup_target"], False))
    return _md(("target", "ratio in bench.json", "target", "measured", "met"), rows)


@_table("bench_rates", BENCH)
def _bench_rates(b: dict) -> list[str]:
    q = b["qlsd_star_chain_iterations_per_second"]
    s = b["settings"]
    rows = [(f"QLSD*, {s['chains']} chains on {b['workers']} worker processes", "chain-iterations / s",
             _rate(q["ours_30_chains"])),
            (f"QLSD*, {s['chains']} chains in one process", "chain-iterations / s", _rate(q["ours_30_chains_one_process"])),
            ("QLSD*, 1 chain", "chain-iterations / s", _rate(q["ours_1_chain"])),
            ("NumPy reference, 1 chain", "chain-iterations / s", _rate(q["numpy_reference_1_chain"])),
            ("`speedup_vs_numpy_one_process`", "ratio", f"{b['speedup_vs_numpy_one_process']:.1f}"),
            ("`federation_overhead`", "ratio", f"{b['federation_overhead']:.2f}"),
            ("`fa_hmc_overhead`", "ratio", f"{b['fa_hmc_overhead']:.2f}"),
            ("`dsgld_overhead`", "ratio", f"{b['dsgld_overhead']:.2f}"),
            ("`dsgld_sparse_speedup`", "ratio", f"{b['dsgld_sparse_speedup']:.1f}")]
    return _md(("measurement", "unit", "value"), rows)


@_table("bench_chains", BENCH)
def _bench_chains(b: dict) -> list[str]:
    scale = b["chains_scale"]
    chains = scale["settings"]["chains"]
    rows = [(name + (" (reference)" if name == scale["reference"] else ""), _rate(r["1_chains"]),
             _rate(r[f"{chains}_chains"]), f"{r['gain']:.2f}", f"{r['gain'] / scale['reference_gain']:.2f}")
            for name, r in scale["chain_iterations_per_second"].items()]
    return _md(("sampler", "1 chain (chain-iterations / s)", f"{chains} chains", "gain",
                "gain over the reference's"), rows)


@_table("bench_large", BENCH)
def _bench_large(b: dict) -> list[str]:
    rows = [(f"{r['settings']['model']} (d = {comma(r['settings']['dim'])})",
             f"{1e3 * r['qlsd_pp_seconds_per_round']:.1f}", f"{1e3 * r['gradients_alone_seconds_per_round']:.1f}",
             f"{r['ratio']:.2f}") for r in b["federation_overhead_large"].values()]
    return _md(("model", "QLSD++ ms a round", "gradients alone ms a round", "ratio"), rows)


@_table("bench_secure_aggregation", BENCH)
def _bench_secure_aggregation(b: dict) -> list[str]:
    r = b["secure_aggregation"]
    up, p = r["upload_bits_per_client_round"], r["protocol_seconds_per_round"]
    rows = [("upload bits per client and round", comma(up["plain"]), comma(up["secure"]), comma(up["secure_dropout"])),
            ("round time over plain", "1", f"{r['round_time_ratio_secure_over_plain']:.2f}",
             f"{r['round_time_ratio_secure_dropout_over_plain']:.2f}"),
            ("masking, all clients / unmasking (ms)", "",
             f"{1e3 * p['clients_masking']:.2f} / {1e3 * p['server_unmasking']:.3f}",
             f"{1e3 * p['clients_masking']:.2f} / {1e3 * p['server_unmasking_one_dropout']:.3f}")]
    if "flower_secagg_round_ratio" in b:
        rows.append(("deployment round over plain (`flower_secagg_round_ratio`)", "1",
                     f"{b['flower_secagg_round_ratio']:.2f}", ""))
    return _md(("", "plain", "secure", "secure, a dropout every round"), rows)


#: The deployment table's rows: bench.json's ``flower`` keys and their labels.
BENCH_DEPLOYMENT = {"qlsd++": "our QLSD++ (node workers)", "fa-hmc": "our FA-HMC (node workers)",
                    "qlsd++_with_hold": "our QLSD++ with holds", "qlsd++_without_node_worker":
                    "our QLSD++ without node workers", "echo_default_loop": "echo, Flower's default loop",
                    "echo_importing_jax": "echo importing JAX"}


@_table("bench_deployment", BENCH)
def _bench_deployment(b: dict) -> list[str]:
    f = b["flower"]
    rows = [(label, f"{f[k]['median_round_seconds']:.2f}", f"{f[k]['median_client_process_seconds']:.2f}")
            for k, label in BENCH_DEPLOYMENT.items()]
    return _md((f"{f['settings']['rounds']} rounds a run, {f['settings']['supernodes']} SuperNodes",
                "median round (s)", "median client process (s)"), rows)


@_table("bench_devices", BENCH)
def _bench_devices(b: dict) -> list[str]:
    dev = b["devices"]
    many = dev["settings"]["many_chains"]

    def value(x):
        return "not measured (one device)" if x is None else x if isinstance(x, (bool, str)) else _rate(x)
    rows = [("device (`platform`, `device_kind`, `count`)", f"{dev['platform']}, {dev['device_kind']}, {dev['count']}"),
            (f"QLSD*, {many:,} chains, chain-iterations / s", "not measured (CPU)" if dev["platform"] == "cpu"
             else value(dev[f"qlsd_star_{many}_chains_chain_iterations_per_second"])),
            ("`spread_speedup` (target: the device count)", value(dev["spread_speedup"])),
            ("`spread_draws_identical`", value(dev["spread_draws_identical"]))]
    return _md(("measurement", "value"), rows)


# --- pages ----------------------------------------------------------------------------------

def _load(root: Path, source: str):
    return json.loads((root / source).read_text())


def render(name: str, root: str | Path = ".") -> str:
    """The Markdown of one table, rendered from its results files.

    Parameters
    ----------
    name
        A key of :data:`TABLES`.
    root
        The repository's root (the sources' paths start there).

    Returns
    -------
    str
        The table's lines, each ending in a newline.
    """
    table = TABLES[name]
    return "\n".join(table.render(*(_load(Path(root), s) for s in table.sources))) + "\n"


def _marker(name: str) -> str:
    return f"<!-- table: {name}, from {', '.join(TABLES[name].sources)} -->"


def update(text: str, root: str | Path = ".") -> str:
    """A page's text with every marked table rendered anew (:func:`render`); the rest unchanged.

    Parameters
    ----------
    text
        The page's Markdown.
    root
        The repository's root.

    Returns
    -------
    str
        ``text`` with each block between ``<!-- table: NAME ... -->`` and ``<!-- /table -->``
        replaced by table ``NAME``.

    Raises
    ------
    KeyError
        For a marked name that :data:`TABLES` does not hold.
    """
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"table {name!r} is marked in the page but not in fedmcmc.app.tables.TABLES")
        return f"{_marker(name)}\n{render(name, root)}<!-- /table -->"
    return _MARKED.sub(replace, text)


def marked(text: str) -> list[str]:
    """The tables a page marks.

    Parameters
    ----------
    text
        The page's Markdown.

    Returns
    -------
    list of str
        The names of its marked tables, in order.
    """
    return [m.group(1) for m in _MARKED.finditer(text)]


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite the marked tables of :data:`PAGES` in place (``--check``: only report stale ones).

    Parameters
    ----------
    argv
        The arguments: ``[--check] [ROOT]`` (the repository's root; default the current folder).

    Returns
    -------
    int
        0, or 1 with ``--check`` when a page is stale.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    args = [a for a in args if a != "--check"]
    root = Path(args[0] if args else ".")
    stale = []
    for page in PAGES:
        path = root / page
        text = path.read_text()
        new = update(text, root)
        if new != text:
            stale.append(page)
            if not check:
                path.write_text(new)
    if check and stale:
        print(f"stale tables in {', '.join(stale)}; regenerate with `{COMMAND}`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
