"""`specdecode bench-serve`: the server's throughput and latency, speculation on and off (bench/serve.py), either
of a server it starts from the serve flags or of one already running (--url)."""
from __future__ import annotations

import argparse
import os
import urllib.parse
from pathlib import Path

from specdecode.bench.prompts import load_prompts
from specdecode.bench.serve import bench_served
from specdecode.bench.serve_client import Level, bench_at, first_model, markdown
from specdecode.cli.commands import COMMANDS
from specdecode.cli.serve import add_server_args, serve_config
from specdecode.errors import ConfigError
from specdecode.server.service import ServeConfig


def _parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ConfigError("--concurrency needs positive integers")
    return levels


def cmd_bench_serve(args: argparse.Namespace) -> int:
    levels = _parse_levels(args.concurrency)
    if args.max_tokens < 1 or (args.requests is not None and args.requests < 1):
        raise ConfigError("--max-tokens and --requests must be positive")
    if args.requests is not None and args.requests < max(levels):  # fewer requests than clients: never reached
        raise ConfigError(f"--requests ({args.requests}) is below --concurrency {max(levels)}: that level would "
                          "never have that many requests in flight")
    _check_out(args.out)  # before the run, not after it
    only = None if args.category is None else tuple(n.strip() for n in args.category.split(",") if n.strip())
    if only is not None and not only:
        raise ConfigError("--category names no category")
    questions = load_prompts(args.prompts, only)
    prompts = [tuple(q.turns) if args.conversations else (q.turns[0],) for q in questions]
    given = [flag for dest, (flag, default) in args.server_flags.items() if getattr(args, dest) != default]
    if args.url:
        results = _bench_running(args, given, prompts, levels)
    else:
        results = bench_served(_started_server(args, given, levels), prompts, levels, args.requests, args.max_tokens)
    table = markdown(results)
    print(table)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(table + "\n")
        except OSError as error:
            raise ConfigError(f"cannot write --out {args.out!r}: {error.strerror or error}") from None
    return 0


def _bench_running(args: argparse.Namespace, given: list[str], prompts: list[tuple[str, ...]],
                   levels: list[int]) -> list[Level]:
    """Benchmark the server at --url (already configured: no server flag may be given)."""
    _check_url(args.url)
    if given:
        raise ConfigError(f"{', '.join(given)} has no effect with --url (it configures the server bench-serve "
                          "starts)")
    model = args.served_model_name or first_model(args.url)
    return bench_at(args.url, model, prompts, levels, args.requests, args.max_tokens)


def _started_server(args: argparse.Namespace, given: list[str], levels: list[int]) -> ServeConfig:
    """The server bench-serve starts, from the serve flags: unless given, a batch row and a queue slot per client."""
    for flag in ("--allow-drafters", "--default-max-tokens"):  # requests name no drafter and send max_tokens
        if flag in given:
            raise ConfigError(f"{flag} has no effect in bench-serve: requests use the server's drafter or none, "
                              "with --max-tokens")
    if args.drafter == "none":
        raise ConfigError("--drafter none: bench-serve compares speculation on and off; choose a drafter")
    if args.max_queue is not None and args.max_queue < max(levels):
        raise ConfigError(f"--max-queue ({args.max_queue}) is below --concurrency {max(levels)}: requests would "
                          "be refused with 429")
    sized = argparse.Namespace(**{**vars(args),
                                  "max_batch": max(8, max(levels)) if args.max_batch is None else args.max_batch,
                                  "max_queue": max(64, max(levels)) if args.max_queue is None else args.max_queue})
    return serve_config(sized)


def _check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(f"--url must be http://HOST[:PORT] (the client speaks plain HTTP), got {url!r}")
    try:
        _ = parts.port  # read for its check: a port that is not a number or out of range raises
    except ValueError as error:
        raise ConfigError(f"--url {url!r}: {error}") from None


def _check_out(out: str | None) -> None:
    """An --out that cannot be written is an error before the run, not a traceback after it."""
    if out is None:
        return
    path = Path(out)
    parent = path.parent
    if path.is_dir():
        raise ConfigError(f"--out {out!r} is a directory; give a file name")
    if not parent.is_dir():
        raise ConfigError(f"cannot write --out {out!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"cannot write --out {out!r}: permission denied")


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help)
    first = len(parser._actions)
    add_server_args(parser)
    parser.set_defaults(max_batch=None, max_queue=None)  # default: the largest --concurrency (at least 8 and 64)
    server_flags = {action.dest: (action.option_strings[0], parser.get_default(action.dest))
                    for action in parser._actions[first:] if action.dest != "served_model_name"}
    parser.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=None,
                        help="questions sent per level (default: max(4, 2 x clients)); each level sends the next ones")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--prompts", default=None,
                        help="JSONL prompts file (default: the built-in set); each question's first turn is sent")
    parser.add_argument("--conversations", action="store_true",
                        help="send every turn of each question, each after the earlier turns and the server's "
                             "answers (an agent's multi-turn edits); a sample per turn")
    parser.add_argument("--category", default=None, metavar="NAMES",
                        help="comma list of categories to send (default: all; the built-in 'agentic' only when named)")
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    parser.set_defaults(func=cmd_bench_serve, server_flags=server_flags)
