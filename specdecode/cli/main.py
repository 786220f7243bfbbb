"""The command line: `specdecode generate|serve|batch|bench|bench-serve|bench-fastpath|bench-quality|
bench-structured|train`. Each subcommand's module maps its flags onto the library's frozen configs, once; user
errors print one line and exit 2, and nothing prints a traceback for bad input. Only the command being run is
imported (commands.py): the others are listed by name and help."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from specdecode.cli.commands import COMMANDS, EXIT_USAGE, Parser, usage_error
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
    argv = sys.argv[1:] if argv is None else argv
    command = next((arg for arg in argv if not arg.startswith("-")), "")  # the parser has no option with a value
    parser = build_parser(command if command in COMMANDS else "")
    args = parser.parse_args(argv)
    _quiet_transformers()
    try:
        return args.func(args)
    except (ConfigError, ModelError) as error:
        print(f"specdecode: error: {usage_error(error)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
