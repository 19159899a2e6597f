"""The padding benchmark runs (its figures are never asserted)."""

from fedmcmc.app.bench.padding import padding_overhead


def test_padding_overhead_reports_the_packed_layout():
    out = padding_overhead(chains=2, iterations=10, repeats=1)
    assert out["padding_overhead_full_batch"] > 0 and out["target"] == 1.2
    settings = out["settings"]
    assert settings["points"] == 2042 and settings["points"] <= settings["rows_stored"] < 20 * 192
