"""`specdecode --help` lists every command without importing any of them (torch, transformers and the server took
6.7 s to import on the 2-core VM), and a command's own parser is the one built in full."""
from __future__ import annotations

import subprocess
import sys

import pytest

from specdecode.cli.commands import COMMANDS
from specdecode.cli.main import build_parser, main


def test_help_lists_every_command_without_importing_torch_or_transformers():
    code = ("import sys\nfrom specdecode.cli.main import main\ntry:\n    main(['--help'])\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\nprint(sorted(m for m in ('torch', 'transformers', 'uvicorn', 'fastapi') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    for name, command in COMMANDS.items():
        assert name in out and command.help.split()[0] in out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_command_gets_its_full_parser_and_the_same_help(name, capsys):
    with pytest.raises(SystemExit) as done:
        main([name, "--help"])
    assert done.value.code == 0
    assert "--" in capsys.readouterr().out  # its own flags, not a bare listing
    actions = build_parser(name)._subparsers._group_actions[0]
    assert {a.dest: a.help for a in actions._choices_actions} == {n: c.help for n, c in COMMANDS.items()}


def test_an_unknown_command_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as done:
        main(["bogus"])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().startswith("specdecode: error: argument command: invalid choice: 'bogus'")


@pytest.mark.parametrize("name", ["bench", "bench-structured"])
def test_threads_beyond_the_cores_are_one_line_and_exit_2(name, monkeypatch, capsys):
    """More threads than cores was accepted, and a run on them crawled (torch's threads wait on each other)."""
    monkeypatch.setattr("specdecode.cli.commands.os.cpu_count", lambda: 2)
    for threads, message in (("3", "3 threads is more than this machine's 2 CPU cores"),
                             ("0", "expected a positive number of threads, got '0'")):
        with pytest.raises(SystemExit) as done:
            main([name, "--threads", threads])
        assert done.value.code == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("argv", [
    ["train", "--kind", "eagle", "--out", ""],  # was the current folder
    ["train", "--kind", "eagle", "--out", "o", "--data", ""],  # was OUT/data
    ["train", "--kind", "eagle", "--out", "o", "--text", ""],
    ["bench", "--out", ""], ["bench", "--prompts", ""],
    ["bench-quality", "--text", ""],  # was the shipped text
    ["bench-quality", "--out", ""],
    ["bench-structured", "--tasks", ""],  # were the shipped tasks
    ["bench-structured", "--out", ""], ["bench-fastpath", "--out", ""],
])
def test_an_empty_path_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[-2]}: expected a path, got ''" in err and err.count("\n") == 1, err
