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
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300].decode(errors='replace')}")
        first, usage = None, None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"].get("message", "error"))
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


def _parse_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--concurrency must be comma-separated integers, got {text!r}") from None
    if not levels or min(levels) < 1:
        raise ConfigError("--concurrency needs positive integers")
    return levels


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from ..bench.prompts import load_prompts

    levels = _parse_levels(args.concurrency)
    if args.max_tokens < 1 or (args.requests is not None and args.requests < 1):
        raise ConfigError("--max-tokens and --requests must be positive")
    prompts = [q.turns[0] for q in load_prompts(args.prompts)]
    if args.url:
        model = args.served_model_name or _first_model(args.url)
        results = bench(args.url, model, prompts, levels, args.requests, args.max_tokens)
    else:
        from .app import create_app
        from .background import BackgroundServer
        from .cli import build_service, check_limits

        check_limits(args)
        args.max_batch = max(args.max_batch, max(levels))
        args.max_queue = max(args.max_queue, max(levels))
        service = build_service(args)
        with BackgroundServer(create_app(service)) as server:
            results = bench(server.url, service.config.model_name, prompts, levels, args.requests, args.max_tokens)
    table = markdown(results)
    print(table)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(table + "\n")
    return 0


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
    from .cli import add_server_args

    parser = subparsers.add_parser(name, help="benchmark the server: tokens/s and latency, speculation on vs off")
    add_server_args(parser)
    parser.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
    parser.add_argument("--concurrency", default="1,4,16", help="comma-separated client counts")
    parser.add_argument("--requests", type=int, default=None, help="requests per level (default: max(4, 2 x clients))")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens per request")
    parser.add_argument("--prompts", default=None, help="JSONL prompts file (default: the built-in set)")
    parser.add_argument("--out", default=None, help="also write the markdown table here")
    parser.set_defaults(func=cmd_bench_serve)
