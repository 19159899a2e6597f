"""The tables of docs/reproductions.md and docs/benchmarks.md between ``<!-- table: NAME -->``
markers are what :mod:`fedmcmc.app.tables` renders from the committed results files, and every
results file records the commit and machine that wrote it."""

import json
from pathlib import Path

from fedmcmc.app import tables
from fedmcmc.runtime import io, provenance

ROOT = Path(__file__).resolve().parents[2]


def test_every_marked_table_is_generated_from_its_results_file():
    for page in tables.PAGES:
        text = (ROOT / page).read_text()
        assert text == tables.update(text, ROOT), (
            f"{page} has a stale table; regenerate it with `{tables.COMMAND}` from the repository's root")


def test_every_registered_table_is_marked_once_and_reads_committed_files():
    names = [name for page in tables.PAGES for name in tables.marked((ROOT / page).read_text())]
    assert sorted(names) == sorted(tables.TABLES)
    assert all((ROOT / source).is_file() for table in tables.TABLES.values() for source in table.sources)


def test_update_rewrites_only_between_the_markers():
    table = tables.render("qlsd_logistic", ROOT)
    text = "prose before\n\n<!-- table: qlsd_logistic -->\n| stale |\n<!-- /table -->\n\nprose after\n"
    assert tables.update(text, ROOT) == ("prose before\n\n<!-- table: qlsd_logistic, from docs/figures/"
                                         f"qlsd_logistic.json -->\n{table}<!-- /table -->\n\nprose after\n")


def test_number_formats():
    assert tables.sci(0.027798, 3) == "2.78e-2" and tables.sci(1.2e-6) == "1.2e-6"
    assert tables.pm(0.02886, 0.001647) == "2.9e-2 ± 0.2e-2" and tables.comma(77537.9) == "77,538"


def test_a_results_file_records_its_provenance(tmp_path):
    written = json.loads(io.write_json(tmp_path / "results.json", {"a": 1}).read_text())
    record = written["provenance"]
    assert written["a"] == 1 and record == json.loads(json.dumps(provenance.record()))
    assert record["version"] and isinstance(record["commit"], str) and record["dirty"] in (True, False, None)
    assert {"platform", "processor", "cores", "memory_bytes", "python", "jax", "backend"} <= set(record["machine"])
    assert "provenance" not in json.loads(io.write_json(tmp_path / "plain.json", {"a": 1}, provenance=False).read_text())
