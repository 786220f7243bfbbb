"""Not a test (run by hand): per-request latency of a running server at one client, to compare the plain server
with `serve --replicas` (docs/scaling.md): 200 sequential GET /v1/models (routing only, no model work) and 100
sequential 1-token greedy completions of one prompt, timed by the client; prints p50 and p95 in ms as JSON.

    .venv/bin/python scripts/request_overhead.py http://127.0.0.1:8000
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import httpx


def percentiles(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {"p50_ms": round(1000 * statistics.median(ordered), 1),
            "p95_ms": round(1000 * ordered[int(0.95 * len(ordered)) - 1], 1)}


def timed(call, times: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - start)
    return seconds


def main(url: str) -> None:
    client = httpx.Client(base_url=url, timeout=60)
    model = client.get("/v1/models").json()["data"][0]["id"]
    body = {"model": model, "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}

    def complete() -> None:
        client.post("/v1/completions", json=body).raise_for_status()

    print(json.dumps({"models": percentiles(timed(lambda: client.get("/v1/models").raise_for_status(), 200, 10)),
                      "completion_1_token": percentiles(timed(complete, 100, 5))}))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
