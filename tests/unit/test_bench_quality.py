"""bench-quality on the tiny model: float32 agrees with itself, int8 is measured against it, bad flags are one
line (exit 2)."""
from __future__ import annotations

import json

import pytest

from specdecode.bench.quality import measure, shipped_text
from specdecode.cli.main import main


def test_formats_against_float32(tiny_model_dir):
    rows = {row.format: row for row in measure(tiny_model_dir, ("float32", "int8"), shipped_text(), 200)}
    assert rows["float32"].agreement == 1.0
    assert 0.5 < rows["int8"].agreement <= 1.0 and rows["int8"].perplexity > 1.0


def test_cli_writes_rows(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "quality.json"
    assert main(["bench-quality", "--model", tiny_model_dir, "--formats", "float32,int8", "--max-tokens", "64",
                 "--out", str(out)]) == 0
    assert [row["format"] for row in json.loads(out.read_text())] == ["float32", "int8"]
    assert "| int8 |" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [(["--formats", "fp8"], "--formats takes"),
                                           (["--max-tokens", "1"], "at least 2"),
                                           (["--text", "/nonexistent/file.txt"], "cannot read --text")])
def test_bad_flags(argv, message, capsys):
    assert main(["bench-quality", *argv]) == 2
    assert message in capsys.readouterr().err
