"""`specdecode bench-serve`: throughput and latency of the server at several concurrency levels, with
speculation on (the server's drafter and K policy) and off (`"speculation": {"drafter": "none"}`), measured in
the same run against the same server, alternating per level. Greedy chat requests over the benchmark prompts;
greedy output does not depend on speculation, so both modes generate the same tokens.

Prints a markdown table; the client is the standard library (threads + http.client), so it also runs against
any OpenAI-compatible server given with --url.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError


@dataclass(frozen=True)
class Sample:
    latency_s: float
    ttft_s: float
    tokens: int
    tau: float


@dataclass(frozen=True)
class Level:
    concurrency: int
    speculation: bool
    samples: tuple[Sample, ...]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.samples)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0

    def latency(self, q: float) -> float:
        return percentile([s.latency_s for s in self.samples], q)

    def ttft(self, q: float) -> float:
        return percentile([s.ttft_s for s in self.samples], q)

    @property
    def tau(self) -> float:
        passes = sum(s.tokens / s.tau for s in self.samples if s.tau > 0)
        return self.tokens / passes if passes else 0.0


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100]) of a non-empty list."""
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def one_request(url: str, body: dict, timeout: float = 900.0) -> Sample:
    """One streaming chat completion; time to first content chunk and to [DONE]."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    began = time.perf_counter()
    try:
        connection.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise ConfigError(f"the server refused a request: HTTP {response.status}: {_error_message(response.read())}")
        first, usage = None, None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise ConfigError(f"the server failed a request: {chunk['error'].get('message', 'error')}")
            usage = chunk.get("usage") or usage
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter() - began
        latency = time.perf_counter() - began
    finally:
        connection.close()
    usage = usage or {}
    return Sample(latency, first if first is not None else latency, int(usage.get("completion_tokens", 0)),
                  float(usage.get("tau", 0.0)))


def run_level(url: str, model: str, prompts: list[str], concurrency: int, requests: int, max_tokens: int,
              speculation: bool) -> Level:
    def body(i: int) -> dict:
        request = {"model": model, "messages": [{"role": "user", "content": prompts[i % len(prompts)]}],
                   "max_tokens": max_tokens, "temperature": 0, "stream": True,
                   "stream_options": {"include_usage": True}}
        if not speculation:
            request["speculation"] = {"drafter": "none"}
        return request

    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        samples = tuple(pool.map(lambda i: one_request(url, body(i)), range(requests)))
    return Level(concurrency, speculation, samples, time.perf_counter() - began)


def markdown(levels: list[Level]) -> str:
    lines = ["| concurrency | speculation | requests | tokens | tokens/s | speedup | p50 latency s | p95 latency s "
             "| p50 TTFT s | tau |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    plain = {level.concurrency: level.tokens_per_s for level in levels if not level.speculation}
    for level in levels:
        base = plain.get(level.concurrency)
        speedup = f"{level.tokens_per_s / base:.2f}x" if base else "-"
        lines.append(f"| {level.concurrency} | {'on' if level.speculation else 'off'} | {len(level.samples)} | "
                     f"{level.tokens} | {level.tokens_per_s:.1f} | {speedup} | {level.latency(50):.2f} | "
                     f"{level.latency(95):.2f} | {level.ttft(50):.2f} | {level.tau:.2f} |")
    return "\n".join(lines)


def bench(url: str, model: str, prompts: list[str], concurrency: list[int], requests: int | None,
          max_tokens: int) -> list[Level]:
    one_request(url, {"model": model, "messages": [{"role": "user", "content": prompts[0]}], "max_tokens": 4,
                      "temperature": 0, "stream": True})  # warm-up
    levels = []
    for c in concurrency:
        n = requests or max(4, 2 * c)
        for speculation in (True, False) if len(levels) % 4 == 0 else (False, True):  # alternate the order
            levels.append(run_level(url, model, prompts, c, n, max_tokens, speculation))
    return levels


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style JSON error body, else the body's start, on one line."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return " ".join(body[:300].decode(errors="replace").split())


def _parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ConfigError("--concurrency needs positive integers")
    return levels


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from .prompts import load_prompts

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
    prompts = [q.turns[0] for q in load_prompts(args.prompts, only)]
    given = [flag for dest, (flag, default) in args.server_flags.items() if getattr(args, dest) != default]
    if args.url:
        _check_url(args.url)
        if given:  # the server at --url is already configured
            raise ConfigError(f"{', '.join(given)} has no effect with --url (it configures the server bench-serve "
                              "starts)")
        model = args.served_model_name or _first_model(args.url)
        results = _bench_at(args.url, model, prompts, levels, args.requests, args.max_tokens)
    else:
        from ..server.app import create_app
        from ..server.background import BackgroundServer
        from ..server.cli import build_service, check_limits

        for flag in ("--allow-drafters", "--default-max-tokens"):  # requests name no drafter and send max_tokens
            if flag in given:
                raise ConfigError(f"{flag} has no effect in bench-serve: requests use the server's drafter or none, "
                                  "with --max-tokens")
        if args.drafter == "none":
            raise ConfigError("--drafter none: bench-serve compares speculation on and off; choose a drafter")
        if args.max_queue is not None and args.max_queue < max(levels):
            raise ConfigError(f"--max-queue ({args.max_queue}) is below --concurrency {max(levels)}: requests would "
                              "be refused with 429")
        # unless given: a batch row and a queue slot per client
        args.max_batch = max(8, max(levels)) if args.max_batch is None else args.max_batch
        args.max_queue = max(64, max(levels)) if args.max_queue is None else args.max_queue
        check_limits(args)
        service = build_service(args)
        with BackgroundServer(create_app(service)) as server:
            results = _bench_at(server.url, service.config.model_name, prompts, levels, args.requests,
                                args.max_tokens)
    table = markdown(results)
    print(table)
    if args.out:
        try:
            with open(args.out, "w", encoding="utf-8") as handle:
                handle.write(table + "\n")
        except OSError as error:
            raise ConfigError(f"cannot write --out {args.out!r}: {error.strerror or error}") from None
    return 0


def _bench_at(url: str, *rest) -> list[Level]:
    """bench(), with a server that cannot be reached as one line."""
    try:
        return bench(url, *rest)
    except (OSError, http.client.HTTPException) as error:
        raise ConfigError(f"cannot reach the server at {url}: {error}") from None


def _check_url(url: str) -> None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ConfigError(f"--url must be http://HOST[:PORT] (the client speaks plain HTTP), got {url!r}")
    try:
        parts.port
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


def _first_model(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
    try:
        connection.request("GET", parts.path.rstrip("/") + "/v1/models")
        return json.loads(connection.getresponse().read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise ConfigError(f"cannot list models at {url}: {error}") from None
    finally:
        connection.close()


def register(subparsers, name: str) -> None:
    from ..server.cli import add_server_args

    parser = subparsers.add_parser(name, help="benchmark the server: tokens/s and latency, speculation on vs off")
    first = len(parser._actions)
    add_server_args(parser)
    parser.set_defaults(max_batch=None, max_queue=None)  # default: the largest --concurrency (at least 8 and 64)
    server_flags = {action.dest: (action.option_strings[0], parser.get_default(action.dest))
                    for action in parser._actions[first:] if action.dest != "served_model_name"}
    parser.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=None, help="requests per level (default: max(4, 2 x clients))")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--prompts", default=None,
                        help="JSONL prompts file (default: the built-in set); each question's first turn is sent")
    parser.add_argument("--category", default=None, metavar="NAMES",
                        help="comma list of categories to send (default: all; the built-in 'agentic' only when named)")
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    parser.set_defaults(func=cmd_bench_serve, server_flags=server_flags)
