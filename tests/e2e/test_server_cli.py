"""`specdecode serve` / `bench-serve` flags: bad input is one line and exit 2; bench-serve prints its table
(tiny model saved to a directory, so the real loading path runs)."""
from __future__ import annotations

import socket

import pytest

from specdecode.cli import serve as serve_module
from specdecode.cli.main import main


@pytest.mark.parametrize("argv,message", [
    (["serve", "--max-batch", "0"], "--max-batch must be >= 1"),
    (["serve", "--allow-drafters", "nope"], "unknown drafter 'nope'"),
    (["serve", "--model", "/does/not/exist"], "model not found"),
    (["bench-serve", "--concurrency", "1,x"], "--concurrency must be comma-separated integers"),
    (["bench-serve", "--max-batch", "0"], "--max-batch must be >= 1"),
])
def test_bad_flags_exit_2_with_one_line(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err


def test_a_port_in_use_or_a_host_that_does_not_resolve_exit_2_before_the_model_loads(capsys, monkeypatch,
                                                                                    tiny_model_dir):
    """uvicorn found these after the model had loaded (tens of seconds for the pair), and exited 3."""
    def never(config):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(serve_module, "build_service", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for argv, message in ((["--port", port], f"cannot serve on 127.0.0.1:{port}: Address already in use"),
                              (["--host", "no-such-host.invalid"], "cannot serve on no-such-host.invalid:8000")):
            assert main(["serve", "--model", tiny_model_dir, *argv]) == 2
            err = capsys.readouterr().err.strip()
            assert message in err and "\n" not in err, err


def test_a_kv_budget_that_holds_no_request_exits_2(capsys, tiny_model_dir):
    """It had started a server that answered every request 413."""
    assert main(["serve", "--model", tiny_model_dir, "--port", "0", "--kv-cache-memory", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--kv-cache-memory holds no request: 1 bytes, less than the" in err and "\n" not in err, err


def test_bench_serve_prints_a_table(capsys, tiny_model_dir, tmp_path):
    out = tmp_path / "table.md"
    argv = ["bench-serve", "--model", tiny_model_dir, "--concurrency", "1,2", "--requests", "2", "--max-tokens", "4",
            "--k-policy", "calibrate", "--out", str(out)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    table = captured.out.strip().splitlines()
    assert table[0].startswith("| concurrency | speculation |") and len(table) == 2 + 4
    assert [row.split("|")[1:3] for row in table[2:]] == [[" 1 ", " on "], [" 1 ", " off "], [" 2 ", " off "],
                                                           [" 2 ", " on "]]
    assert all(int(row.split("|")[4]) > 0 for row in table[2:])  # tokens generated
    assert "verify-pass cost (ms)" in captured.err
    assert out.read_text().strip() == captured.out.strip()
