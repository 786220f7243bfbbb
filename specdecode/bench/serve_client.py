"""The client of `specdecode bench-serve` (bench/serve.py): streaming chat requests from a pool of threads, timed
to the first content chunk and to [DONE], over concurrency levels with speculation on and off. The standard
library only (threads + http.client), so it runs against any OpenAI-compatible server and, in a process of its
own, imports neither torch nor the server.

A client plays a conversation: its turns one after another, each sent with the earlier turns and the server's
own answers to them, as an agent sends its next edit of a file (one turn: a single request). Each level starts
at the conversation after the last one the previous level sent (wrapping), so a server that learns from earlier
requests (a suffix store) does not meet a level's conversations again; speculation on and off at one level send
the same ones, as their tokens must be the same. Against a server that keeps prompts' KV for later requests, each
level and mode can send a `cache_salt` of its own (vLLM's field), so the mode that runs second does not find the
first one's prompts cached."""
from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from specdecode.errors import ConfigError


@dataclass(frozen=True)
class Sample:
    latency_s: float
    ttft_s: float
    tokens: int
    tau: float
    prompt_tokens: int = 0
    cached_tokens: int = 0  # usage.prompt_tokens_details.cached_tokens: prompt tokens the server did not prefill


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
    def cached_share(self) -> float:
        """Share of the prompt tokens the server said it had cached (0 where it says nothing)."""
        prompt = sum(s.prompt_tokens for s in self.samples)
        return sum(s.cached_tokens for s in self.samples) / prompt if prompt else 0.0

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


def one_request(url: str, body: dict, timeout: float = 900.0) -> tuple[Sample, str]:
    """One streaming chat completion; time to first content chunk and to [DONE], and the answer's text."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    began = time.perf_counter()
    try:
        connection.request("POST", parts.path.rstrip("/") + "/v1/chat/completions", json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        if response.status != 200:
            raise ConfigError(f"the server refused a request: HTTP {response.status}: "
                              f"{_error_message(response.read())}")
        first, usage, text = None, None, []
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise ConfigError(f"the server failed a request: {chunk['error'].get('message', 'error')}")
            usage = chunk.get("usage") or usage
            content = "".join(c.get("delta", {}).get("content") or "" for c in chunk.get("choices", []))
            if content and first is None:
                first = time.perf_counter() - began
            text.append(content)
        latency = time.perf_counter() - began
    finally:
        connection.close()
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return Sample(latency, first if first is not None else latency, int(usage.get("completion_tokens", 0)),
                  float(usage.get("tau", 0.0)), int(usage.get("prompt_tokens", 0)), int(cached)), "".join(text)


def conversation(url: str, model: str, turns: Sequence[str], max_tokens: int, speculation: bool,
                 salt: str | None = None) -> list[Sample]:
    """Every turn in order, each sent after the earlier turns and the server's answers to them (with `salt` as
    its cache_salt)."""
    messages: list[dict[str, str]] = []
    samples = []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        request = {"model": model, "messages": list(messages), "max_tokens": max_tokens, "temperature": 0,
                   "stream": True, "stream_options": {"include_usage": True}}
        if not speculation:
            request["speculation"] = {"drafter": "none"}
        if salt is not None:
            request["cache_salt"] = salt
        sample, answer = one_request(url, request)
        samples.append(sample)
        messages.append({"role": "assistant", "content": answer})
    return samples


def level_conversations(conversations: Sequence[Sequence[str]], start: int, count: int) -> list[Sequence[str]]:
    """`count` conversations from index `start` on, wrapping.

    Example: 3 conversations a, b, c; start 2, count 3 -> c, a, b."""
    return [conversations[(start + i) % len(conversations)] for i in range(count)]


def run_level(url: str, model: str, conversations: Sequence[Sequence[str]], concurrency: int, max_tokens: int,
              speculation: bool, salt: str | None = None) -> Level:
    """`concurrency` clients playing the conversations (conversation()); a sample per turn."""
    began = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        played = list(pool.map(lambda turns: conversation(url, model, turns, max_tokens, speculation, salt),
                               conversations))
    return Level(concurrency, speculation, tuple(s for samples in played for s in samples),
                 time.perf_counter() - began)


def markdown(levels: list[Level]) -> str:
    lines = ["| concurrency | speculation | requests | tokens | tokens/s | speedup | p50 latency s | p95 latency s "
             "| p50 TTFT s | tau | prompt cached |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    plain = {level.concurrency: level.tokens_per_s for level in levels if not level.speculation}
    for level in levels:
        base = plain.get(level.concurrency)
        speedup = f"{level.tokens_per_s / base:.2f}x" if base else "-"
        lines.append(f"| {level.concurrency} | {'on' if level.speculation else 'off'} | {len(level.samples)} | "
                     f"{level.tokens} | {level.tokens_per_s:.1f} | {speedup} | {level.latency(50):.2f} | "
                     f"{level.latency(95):.2f} | {level.ttft(50):.2f} | {level.tau:.2f} | "
                     f"{100 * level.cached_share:.0f}% |")
    return "\n".join(lines)


def bench(url: str, model: str, conversations: Sequence[Sequence[str]], concurrency: list[int],
          requests: int | None, max_tokens: int, salted: bool = False) -> list[Level]:
    """Each level: `requests` conversations (default max(4, 2 x clients)), speculation on and off; salted: each
    level and mode with a cache_salt of its own (a server that takes the field)."""
    one_request(url, {"model": model, "messages": [{"role": "user", "content": conversations[0][0]}],
                      "max_tokens": 4, "temperature": 0, "stream": True})  # warm-up
    levels, start = [], 0
    for c in concurrency:
        n = requests or max(4, 2 * c)
        chosen = level_conversations(conversations, start, n)
        start += n
        for speculation in (True, False) if len(levels) % 4 == 0 else (False, True):  # alternate the order
            salt = f"level{len(levels)}" if salted else None
            levels.append(run_level(url, model, chosen, c, max_tokens, speculation, salt))
    return levels


def _error_message(body: bytes) -> str:
    """The message of an OpenAI-style JSON error body, else the body's start, on one line."""
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return " ".join(body[:300].decode(errors="replace").split())


def bench_at(url: str, *rest) -> list[Level]:
    """bench(), with a server that cannot be reached as one line."""
    try:
        return bench(url, *rest)
    except (OSError, http.client.HTTPException) as error:
        raise ConfigError(f"cannot reach the server at {url}: {error}") from None


def first_model(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=30)
    try:
        connection.request("GET", parts.path.rstrip("/") + "/v1/models")
        return json.loads(connection.getresponse().read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise ConfigError(f"cannot list models at {url}: {error}") from None
    finally:
        connection.close()
