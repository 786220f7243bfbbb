"""The documentation stays runnable: every `specdecode ...` command shown in README.md and docs/*.md parses with
the CLI's own parser (flags and values exist; nothing runs or loads), every relative link points at a file
that exists, with its heading where it names one, and README.md stays short."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from specdecode.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
COMMAND = re.compile(r"(?:\.venv/bin/)?specdecode "
                     r"((?:generate|bench-serve|bench-fastpath|bench-structured|bench-quality|bench|serve|train)\b.*)")
PLACEHOLDERS = {"W,N,G": "1,4,1", "PROMPT": "hi"}


def _commands(page: Path) -> list[str]:
    """Command lines of the page's code blocks (continuations joined) and inline code spans."""
    text = page.read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
    spans = [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))]
    lines = [line.split("  #")[0].strip() for block in blocks for line in re.sub(r"\\\n\s*", " ", block).splitlines()]
    return [match.group(1).strip() for line in lines + spans if (match := COMMAND.search(line))]


def _slug(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


CASES = [(page.relative_to(ROOT).as_posix(), command) for page in PAGES for command in _commands(page)]


def test_the_pages_show_commands():
    assert len(CASES) > 20


@pytest.mark.parametrize("page, command", CASES)
def test_shown_commands_parse(page, command):
    argv = [PLACEHOLDERS.get(arg, arg) for arg in shlex.split(command)]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit:
        pytest.fail(f"{page}: `specdecode {command}` does not parse: {errors.getvalue().strip()}")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_relative_links_resolve(page):
    for link in re.findall(r"\]\(([^)]+)\)", page.read_text()):
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        assert target.exists(), f"{page.name}: {link} does not exist"
        if anchor:
            headings = [_slug(line.lstrip("#")) for line in target.read_text().splitlines() if line.startswith("#")]
            assert anchor in headings, f"{page.name}: {link} names no heading of {target.name}"


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 120
    assert lines[3].startswith("make demo") and lines[4].startswith("make test")


def test_docs_stay_small():
    """docs/ holds short reports, not raw results: `bench` writes results.json, logs and plots under out/."""
    files = [path for path in (ROOT / "docs").rglob("*") if path.is_file()]
    assert sum(path.stat().st_size for path in files) <= 600 * 1024
    assert not [path for path in files if path.suffix in (".json", ".log")]


@pytest.mark.parametrize("command", ["generate", "bench", "serve", "bench-serve", "bench-fastpath", "bench-quality",
                                     "train"])
def test_every_command_prints_its_help(command, capsys):
    """argparse formats help strings with %: a stray one crashes --help (it did, for serve)."""
    from specdecode.cli.main import main

    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    assert "usage:" in capsys.readouterr().out
