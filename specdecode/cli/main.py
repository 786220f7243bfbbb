"""The command line: `specdecode generate|serve|bench|bench-serve|bench-fastpath|bench-quality|bench-structured|
train`. Each subcommand's module maps its flags onto the library's frozen configs, once; user errors print one
line and exit 2, and nothing prints a traceback for bad input."""
from __future__ import annotations

import argparse
import os
import sys

import transformers

from specdecode.cli import bench, bench_serve, bench_tools, generate, serve, train
from specdecode.cli.args import EXIT_USAGE, Parser, usage_error
from specdecode.errors import ConfigError, ModelError


def _quiet_transformers() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdecode", description="Lossless speculative decoding for Hugging Face causal LMs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    generate.register(sub, "generate")
    bench.register(sub, "bench")
    serve.register(sub, "serve")
    train.register(sub, "train")
    bench_serve.register(sub, "bench-serve")
    bench_tools.register_fastpath(sub, "bench-fastpath")
    bench_tools.register_quality(sub, "bench-quality")
    bench_tools.register_structured(sub, "bench-structured")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
