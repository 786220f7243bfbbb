"""The subcommands by name: their one-line help and the module that builds each one's parser, and the pieces every
parser shares (one-line errors, exit code 2). Nothing here imports torch, transformers or the server, so
`specdecode --help` lists the commands without importing any command, and a command imports only its own module:
importing all of them took 6.7 s of the 7.5 s `specdecode --help` took on the 2-core AMD EPYC VM."""
from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from specdecode.errors import OptionError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command Ctrl-C ended
EXIT_PIPE = 141  # 128 + SIGPIPE: stdout's reader went away


@dataclass(frozen=True)
class Command:
    """module: where `register(subparsers, name)` builds the command's parser (register: that function's name)."""

    module: str
    help: str
    register: str = "register"


COMMANDS: dict[str, Command] = {
    "generate": Command("specdecode.cli.generate", "generate text for one prompt, streaming, then print metrics"),
    "bench": Command("specdecode.cli.bench", "Spec-Bench-style benchmark: specdecode drafters vs transformers "
                                             "generate / assisted generation"),
    "serve": Command("specdecode.cli.serve", "OpenAI-compatible HTTP server with batched speculative decoding"),
    "batch": Command("specdecode.cli.batch", "run an OpenAI batch file (JSONL requests) offline through the server, "
                                             "one result line per request"),
    "train": Command("specdecode.cli.train", "train an EAGLE, EAGLE-3 or Medusa drafter head for a target model"),
    "bench-serve": Command("specdecode.cli.bench_serve",
                           "benchmark the server: tokens/s and latency, speculation on vs off"),
    "bench-fastpath": Command("specdecode.cli.bench_tools", "fast path vs eager: tokens/s as a fraction of the "
                              "bandwidth floor, and the per-pass cost curve (default model or a random Llama shape)",
                              "register_fastpath"),
    "bench-quality": Command("specdecode.cli.bench_tools",
                             "greedy token agreement and perplexity of weight formats vs float32", "register_quality"),
    "bench-structured": Command("specdecode.cli.bench_tools", "structured outputs under speculation: each drafter "
                                "with and without grammar drafting against constrained plain decoding",
                                "register_structured"),
}


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def flag(option: str) -> str:
    """The command-line flag of a library option name (exit_layer -> --exit-layer)."""
    return "--" + option.replace("_", "-")


def usage_error(error: Exception) -> str:
    """A library error as the command line says it: option names as flags."""
    return error.spelled(flag) if isinstance(error, OptionError) else str(error)


def whole_number(text: str, least: int, what: str) -> int:
    """An argparse type's integer of at least `least`; else one line naming `what` was expected."""
    try:
        value = int(text)
    except ValueError:
        value = least - 1
    if value < least:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def threads_arg(text: str) -> int:
    """argparse type for --threads: a positive count no larger than this machine's cores (os.cpu_count). More
    threads than cores do not run faster: torch's threads wait on each other, and a pass slows to a crawl."""
    value = whole_number(text, 1, "a positive number of threads")
    cores = os.cpu_count() or 1
    if value > cores:
        raise argparse.ArgumentTypeError(f"{value} threads is more than this machine's {cores} CPU cores")
    return value


def path_arg(text: str) -> str:
    """argparse type for a file or folder flag: '' is refused, where it was read as the current folder (--out) or
    as no path at all, so that the default (the shipped data, OUT/data) ran in its place."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    return text
