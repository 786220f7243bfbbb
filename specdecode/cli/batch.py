"""`specdecode batch`: an OpenAI batch file (JSONL requests) run offline through the server's app, one result line
per request, in order (server/batch.py). Takes `serve`'s model, drafter and batching flags. The input's lines are
read again from the file as they are sent and the output written as results come, so a file of any length runs in
the memory of the requests in flight."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from specdecode.cli.commands import COMMANDS
from specdecode.cli.serve import add_server_args, serve_config
from specdecode.errors import ConfigError
from specdecode.paths import output_file
from specdecode.server.batch import BatchLines, index_lines, run_batch
from specdecode.server.protocol.batch_file import FileBytes, begins_result, result_text, results_done
from specdecode.server.service import build_service


def cmd_batch(args: argparse.Namespace) -> int:
    source = Path(args.input)
    if not source.is_file():
        raise ConfigError(f"--input {args.input!r} is not a file")
    _check_output(args.output, source)
    with open(source, "rb") as handle:
        try:
            lines = index_lines(handle, FileBytes(handle.fileno()))
        except UnicodeDecodeError as error:
            raise ConfigError(f"--input {args.input!r} is not UTF-8 text ({error.reason} at byte {error.start})") \
                from None
        if not len(lines):
            raise ConfigError(f"--input {args.input!r} holds no requests")
        done = _resume(Path(args.output), lines) if args.resume else 0
        began, counts = time.perf_counter(), Counter()
        if done < len(lines):
            # no kept responses: a line cannot name another's response, whose id it cannot know; no files API either
            service = build_service(dataclasses.replace(serve_config(args), responses_kept=0, files_bytes=0))
            try:
                out = sys.stdout if args.output == "-" else open(args.output, "a" if done else "w",  # noqa: SIM115
                                                                  encoding="utf-8")
            except OSError as error:
                raise ConfigError(f"--output {args.output!r} cannot be written: {error.strerror or error}") from None
            try:
                async def write_all() -> None:
                    async with contextlib.aclosing(run_batch(service, lines, concurrency=args.max_batch,
                                                             first=done)) as results:
                        async for line in results:
                            status = line["response"]["status_code"] if line["response"] else None
                            counts["ok" if status == 200 else "failed"] += 1
                            try:
                                out.write(result_text(line))
                                out.flush()
                            except BrokenPipeError:  # `-o -` and its reader went away: cli/main.py ends quietly
                                raise
                            except OSError as error:  # a full disk, say: what is written stands
                                raise ConfigError(f"--output {args.output!r}: writing failed "
                                                  f"({error.strerror or error}); its whole lines stand, and --resume "
                                                  "continues after them") from None
                asyncio.run(write_all())
            finally:
                if out is not sys.stdout:
                    with contextlib.suppress(OSError):  # (what was not written was said above)
                        out.close()
    resumed = f", {done} already in {args.output}" if args.resume else ""
    print(f"batch: {len(lines)} requests{resumed}, {counts['ok']} answered 200, {counts['failed']} failed "
          f"({time.perf_counter() - began:.1f} s)", file=sys.stderr)
    return 0


def _check_output(output: str, source: Path) -> None:
    """--output is a file this run may write, and not the input: checked before the model loads (and before an
    output a mistyped flag would not reach is truncated)."""
    if output == "-":
        return
    path = output_file(output, "--output")
    if path.exists() and path.samefile(source):
        raise ConfigError(f"--output {output!r} is the --input file (its lines are read again as they are sent)")


def _resume(output: Path, lines: BatchLines) -> int:
    """How many requests `output` already answers (batch_file.results_done), after cutting off a last line that a
    stopped run left half written (one that begins as a result line does: anything else is not ours to cut, and
    exits 2 with the file kept); 0 when there is no output yet. The output is read a line at a time."""
    if str(output) == "-":
        raise ConfigError("--resume needs --output to be a file (it continues the results written there)")
    if not output.is_file():
        return 0
    whole = 0  # bytes of the whole lines read so far

    def results(handle: BinaryIO) -> Iterator[str]:
        nonlocal whole
        for number, raw in enumerate(handle, start=1):
            if not raw.endswith(b"\n"):
                if begins_result(raw):
                    return  # a half-written last line
                raise ValueError(f"its line {number} ends with no newline and does not begin as a result line")
            whole += len(raw)
            yield raw[:-1].decode("utf-8")
    try:
        with open(output, "rb") as handle:
            done = results_done(results(handle), lines)
    except (UnicodeDecodeError, ValueError) as error:
        reason = "it is not UTF-8 text" if isinstance(error, UnicodeDecodeError) else str(error)
        raise ConfigError(f"--resume: --output {str(output)!r} does not continue this --input: {reason}") from None
    if whole < output.stat().st_size:
        with open(output, "r+b") as handle:
            handle.truncate(whole)
    return done


def register(subparsers, name: str) -> None:
    parser = subparsers.add_parser(name, help=COMMANDS[name].help)
    add_server_args(parser)
    parser.add_argument("-i", "--input", required=True,
                        help="OpenAI batch file: one JSON request a line ({\"custom_id\", \"method\": \"POST\", "
                             "\"url\": \"/v1/chat/completions\", \"body\": {...}}; also /v1/completions, "
                             "/v1/responses, /v1/messages)")
    parser.add_argument("-o", "--output", required=True,
                        help="where the result lines go, one per request in the input's order ('-': stdout)")
    parser.add_argument("--resume", action="store_true",
                        help="continue a run that stopped: keep the results already in --output (written in the "
                             "input's order, so they answer its first lines) and append the rest")
    parser.set_defaults(func=cmd_batch)
