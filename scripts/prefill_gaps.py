"""A running stream's gaps while a long prompt (~3,000 tokens) arrives, on the default model's server: the stream's
idle gap between SSE events (before the prompt arrives, and that of the same stream run alone, at the same
events), and the median and largest gap while the prompt is prefilled (docs/serving.md, "Continuous batching").

    .venv/bin/python scripts/prefill_gaps.py [trials] [--scored]

--scored: the long prompt is scored (`echo`, `logprobs: 0`, `max_tokens: 0`) rather than decoded, with a different
first line each trial (a scored prompt never reuses a parked row's KV; a decoded one would).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from specdecode.config import DrafterConfig, ModelConfig
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.service import ServeConfig, build_service

LONG_PROMPT = " ".join(f"item{i} is a word" for i in range(440))  # 2,970 tokens for SmolLM2


STREAM = """
import json, sys, time
import httpx
body = {"model": sys.argv[2], "prompt": "Count from one to one thousand: one, two, three,", "max_tokens": 1500,
        "ignore_eos": True, "temperature": 0, "stream": True, "speculation": {"drafter": "none"}}
times = []
with httpx.stream("POST", sys.argv[1] + "/v1/completions", json=body, timeout=300) as reply:
    for line in reply.iter_lines():
        if line.startswith("data: {"):
            times.append(time.perf_counter())
print(json.dumps(times))
"""


def start_stream(server: BackgroundServer, model: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", STREAM, server.url, model], stdout=subprocess.PIPE, text=True)


def gaps_of(stream: subprocess.Popen) -> list[tuple[float, float]]:
    """(gap, when the earlier event came) for each pair of the stream's events, in order."""
    times = json.loads(stream.communicate()[0])
    return [(later - earlier, earlier) for earlier, later in zip(times, times[1:])]


def trial(server: BackgroundServer, model: str, alone: list[tuple[float, float]], number: int = 0,
          scored: bool = False) -> str:
    """Both clients are processes of their own: in this process their threads took CPU and the GIL from the
    server's and held the stream longer than the server did; the long request is curl's, as a second Python
    process starting up took the CPU from the stream's client and delayed its reads by up to 170 ms
    (perf_counter is the machine's monotonic clock, the same in every process). A stream's step grows with its
    context (at 1,000 tokens the keys and values it reads are about half the weights' bytes), so its gaps are
    also set against those of the same stream run `alone`, event for event."""
    stream = start_stream(server, model)
    time.sleep(4.0)
    sent = time.perf_counter()
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json",
            "--data-binary", "@-", server.url + "/v1/completions"]
    status = subprocess.run(curl, capture_output=True, text=True,
                            input=json.dumps(_long_request(model, number, scored))).stdout
    done = time.perf_counter()
    gaps = gaps_of(stream)
    idle = statistics.median(gap for gap, at in gaps if at < sent - 0.2)
    events = [i for i, (_, at) in enumerate(gaps) if sent <= at <= done]
    during = [gaps[i][0] for i in events]
    same_events = [gap for gap, _ in alone[events[0] : events[-1] + 1]]
    same = statistics.median(same_events)
    return (f"long request {done - sent:.2f} s ({status}); stream gap idle {idle * 1000:.1f} ms (alone at the "
            f"same events {same * 1000:.1f} ms), during prefill median {statistics.median(during) * 1000:.1f} ms, "
            f"max {max(during) * 1000:.1f} ms ({max(during) / idle:.1f}x idle, {max(during) / same:.1f}x alone at "
            f"the same events; alone its own max there is {max(same_events) / same:.1f}x)")


def _long_request(model: str, number: int, scored: bool) -> dict:
    if not scored:
        return {"model": model, "prompt": LONG_PROMPT, "max_tokens": 1, "temperature": 0}
    return {"model": model, "prompt": f"Trial {number}. {LONG_PROMPT}", "max_tokens": 0, "echo": True, "logprobs": 0}


def main() -> None:
    service = build_service(ServeConfig(ModelConfig(), DrafterConfig("prompt-lookup")).resolved())
    print("long prompt tokens:", len(service.target.tokenizer(LONG_PROMPT)["input_ids"]), flush=True)
    with BackgroundServer(create_app(service)) as server:
        alone = gaps_of(start_stream(server, service.config.model_name))
        args = [arg for arg in sys.argv[1:] if arg != "--scored"]
        for number in range(int(args[0]) if args else 2):
            print(f"trial {number}: {trial(server, service.config.model_name, alone, number, '--scored' in sys.argv)}",
                  flush=True)


if __name__ == "__main__":
    main()
