"""The command line: `specdecode generate|serve|batch|bench|bench-serve|bench-fastpath|bench-quality|
bench-structured|train`. Each subcommand's module maps its flags onto the library's frozen configs, once; user
errors print one line and exit 2, and nothing prints a traceback for bad input. Only the command being run is
imported (commands.py): the others are listed by name and help."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys

from specdecode.cli.commands import COMMANDS, EXIT_INTERRUPTED, EXIT_PIPE, EXIT_USAGE, Parser, usage_error
from specdecode.errors import ConfigError, ModelError


def _quiet_transformers() -> None:
    import transformers  # here, not at the top: `specdecode --help` imports no model code

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every subcommand in full, or (only: a command's name) just that one, the others
    by name and help without importing their modules."""
    parser = Parser(prog="specdecode", description="Lossless speculative decoding for Hugging Face causal LMs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name, command in COMMANDS.items():
        if only is None or name == only:
            getattr(importlib.import_module(command.module), command.register)(sub, name)
        else:
            sub.add_parser(name, help=command.help)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run a command. An interrupt exits 130 at any point, the imports of a command's module included (Ctrl-C in the
    first seconds printed a traceback); a reader that closed stdout (`| head`) ends the command quietly (_closed)."""
    try:
        _tolerant_stdout()
        return _run(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _closed()


def _run(argv: list[str]) -> int:
    command = next((arg for arg in argv if not arg.startswith("-")), "")  # the parser has no option with a value
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)
    _quiet_transformers()
    try:
        return args.func(args)
    except (ConfigError, ModelError) as error:
        print(f"specdecode: error: {usage_error(error)}", file=sys.stderr)
        return EXIT_USAGE


def _tolerant_stdout() -> None:
    """Text stdout cannot encode (PYTHONIOENCODING=ascii, a C locale) is written as backslash escapes, as Python's
    stderr writes it, rather than a UnicodeEncodeError ending the command part way: the escapes keep each code
    point, where "replace" would print ? for all of them."""
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")


def _closed() -> int:
    """stdout's reader went away (`specdecode generate ... | head -c 10`): stop quietly as Unix tools do, with the
    status a shell gives a command SIGPIPE ended (141), so a pipeline with pipefail sees the output was cut, and not
    a failure of the command (1). stdout goes to devnull, so Python's flush at exit does not fail again (the
    recipe in Python's signal docs)."""
    with contextlib.suppress(OSError, ValueError):  # a stdout with no descriptor (a test's capture)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_PIPE


if __name__ == "__main__":
    sys.exit(main())
