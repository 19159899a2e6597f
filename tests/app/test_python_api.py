"""docs/how-to/python-api.md's Python examples run as written."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "python-api.md"


def test_python_api_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDMCMC_CACHE", str(tmp_path))
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 3
    exec(compile("\n".join(blocks), str(PAGE), "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert float(printed[-2]) < 0.05  # de-biased FA-HMC's marginal error against NUTS
    assert printed[-1] == f"(4, 300, 9) {10 * 32 * 18}.0 bits of surrogates"  # diagonal: 9 + 9 floats a shard
