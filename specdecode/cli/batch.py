"""`specdecode batch`: an OpenAI batch file (JSONL requests) run offline through the server's app, one result line
per request, in order (server/batch.py). Takes `serve`'s model, drafter and batching flags."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import time
from collections import Counter
from pathlib import Path

from specdecode.cli.commands import COMMANDS
from specdecode.cli.serve import add_server_args, serve_config
from specdecode.errors import ConfigError
from specdecode.server.batch import read_requests, run_batch
from specdecode.server.service import build_service


def cmd_batch(args: argparse.Namespace) -> int:
    source = Path(args.input)
    if not source.is_file():
        raise ConfigError(f"--input {args.input!r} is not a file")
    try:
        requests = read_requests(source.read_text(encoding="utf-8").split("\n"))
    except UnicodeDecodeError as error:
        raise ConfigError(f"--input {args.input!r} is not UTF-8 text ({error.reason} at byte {error.start})") from None
    if not requests:
        raise ConfigError(f"--input {args.input!r} holds no requests")
    if args.output != "-" and not Path(args.output).parent.is_dir():
        raise ConfigError(f"--output {args.output!r}: its folder does not exist")
    # no kept responses: a line cannot name another's response, whose id it cannot know; no files API either
    service = build_service(dataclasses.replace(serve_config(args), responses_kept=0, files_bytes=0))
    began, counts = time.perf_counter(), Counter()
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115 - or stdout
    try:
        async def write_all() -> None:
            async for line in run_batch(service, requests, concurrency=args.max_batch):
                status = line["response"]["status_code"] if line["response"] else None
                counts["ok" if status == 200 else "failed"] += 1
                out.write(json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n")
                out.flush()
        asyncio.run(write_all())
    finally:
        if out is not sys.stdout:
            out.close()
    print(f"batch: {len(requests)} requests, {counts['ok']} answered 200, {counts['failed']} failed "
          f"({time.perf_counter() - began:.1f} s)", file=sys.stderr)
    return 0


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help)
    add_server_args(parser)
    parser.add_argument("-i", "--input", required=True,
                        help="OpenAI batch file: one JSON request a line ({\"custom_id\", \"method\": \"POST\", "
                             "\"url\": \"/v1/chat/completions\", \"body\": {...}}; also /v1/completions, "
                             "/v1/responses, /v1/messages)")
    parser.add_argument("-o", "--output", required=True,
                        help="where the result lines go, one per request in the input's order ('-': stdout)")
    parser.set_defaults(func=cmd_batch)
