"""A running stream's gaps while a long prompt (~3,000 tokens) arrives, on the default model's server: the stream's
idle gap between SSE events, and the median and largest gap while the prompt is prefilled (docs/serving.md,
"Continuous batching").

    .venv/bin/python scripts/prefill_gaps.py [trials]
"""
from __future__ import annotations

import statistics
import sys
import threading
import time

import httpx

from specdecode.config import DrafterConfig, ModelConfig
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.service import ServeConfig, build_service

LONG_PROMPT = " ".join(f"item{i} is a word" for i in range(440))  # 2,970 tokens for SmolLM2


def stream_times(url: str, model: str, times: list[float]) -> None:
    """A stream of one token per step (no speculation) that does not stop at EOS; each event's arrival time."""
    body = {"model": model, "prompt": "Count from one to one thousand: one, two, three,", "max_tokens": 1200,
            "ignore_eos": True, "temperature": 0, "stream": True, "speculation": {"drafter": "none"}}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())


def trial(server: BackgroundServer, model: str) -> str:
    times: list[float] = []
    thread = threading.Thread(target=stream_times, args=(server.url, model, times))
    thread.start()
    time.sleep(2.0)
    sent = time.perf_counter()
    reply = httpx.post(server.url + "/v1/completions", timeout=300,
                       json={"model": model, "prompt": LONG_PROMPT, "max_tokens": 1, "temperature": 0})
    done = time.perf_counter()
    thread.join()
    gaps = [(later - earlier, earlier) for earlier, later in zip(times, times[1:])]
    idle = statistics.median(gap for gap, at in gaps if at < sent - 0.2)
    during = [gap for gap, at in gaps if sent <= at <= done]
    return (f"long request {done - sent:.2f} s ({reply.status_code}); stream gap idle {idle * 1000:.1f} ms, during "
            f"prefill median {statistics.median(during) * 1000:.1f} ms, max {max(during) * 1000:.1f} ms "
            f"({max(during) / idle:.1f}x idle)")


def main() -> None:
    service = build_service(ServeConfig(ModelConfig(), DrafterConfig("prompt-lookup")).resolved())
    print("long prompt tokens:", len(service.target.tokenizer(LONG_PROMPT)["input_ids"]), flush=True)
    with BackgroundServer(create_app(service)) as server:
        for number in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
            print(f"trial {number}: {trial(server, service.config.model_name)}", flush=True)


if __name__ == "__main__":
    main()
