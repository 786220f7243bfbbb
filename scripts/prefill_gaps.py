"""A running stream's gaps while a long prompt (~3,000 tokens) arrives, on the default model's server: the stream's
idle gap between SSE events, and the median and largest gap while the prompt is prefilled (docs/serving.md,
"Continuous batching").

    .venv/bin/python scripts/prefill_gaps.py [trials]
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


def trial(server: BackgroundServer, model: str) -> str:
    """Both clients are processes of their own: in this process their threads took CPU and the GIL from the
    server's and held the stream longer than the server did; the long request is curl's, as a second Python
    process starting up took the CPU from the stream's client and delayed its reads by up to 170 ms
    (perf_counter is the machine's monotonic clock, the same in every process)."""
    stream = subprocess.Popen([sys.executable, "-c", STREAM, server.url, model], stdout=subprocess.PIPE, text=True)
    time.sleep(4.0)
    sent = time.perf_counter()
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Content-Type: application/json",
            "--data-binary", "@-", server.url + "/v1/completions"]
    status = subprocess.run(curl, capture_output=True, text=True,
                            input=json.dumps({"model": model, "prompt": LONG_PROMPT, "max_tokens": 1,
                                              "temperature": 0})).stdout
    done = time.perf_counter()
    times = json.loads(stream.communicate()[0])
    gaps = [(later - earlier, earlier) for earlier, later in zip(times, times[1:])]
    idle = statistics.median(gap for gap, at in gaps if at < sent - 0.2)
    during = [gap for gap, at in gaps if sent <= at <= done]
    return (f"long request {done - sent:.2f} s ({status}); stream gap idle {idle * 1000:.1f} ms, during "
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
