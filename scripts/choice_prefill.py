"""What n choices of one long prompt cost against one, on the default model's server: a ~1,130-token prompt, 32
greedy tokens a choice, a different prompt each run (so no finished request's row holds it), in seconds of
one request (docs/serving.md, "API": many choices).

    .venv/bin/python scripts/choice_prefill.py [runs] [n]
"""
from __future__ import annotations

import sys
import time

import httpx

from specdecode.config import DrafterConfig, ModelConfig
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.service import ServeConfig, build_service

TEXT = " ".join(f"item{i} is a word" for i in range(176))  # about 1,130 tokens with the request's line (SmolLM2)


def ask(url: str, model: str, label: str, n: int) -> tuple[float, dict]:
    body = {"model": model, "prompt": f"Request {label}. Summarise this:\n{TEXT}", "max_tokens": 32,
            "temperature": 0, "n": n, "ignore_eos": True}
    began = time.perf_counter()
    reply = httpx.post(url + "/v1/completions", json=body, timeout=600)
    reply.raise_for_status()
    return time.perf_counter() - began, reply.json()


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    service = build_service(ServeConfig(ModelConfig(), DrafterConfig("prompt-lookup")).resolved())
    model = service.config.model_name
    with BackgroundServer(create_app(service)) as server:
        ask(server.url, model, "warm-up", 1)
        for run in range(runs):
            one, single = ask(server.url, model, f"one-{run}", 1)
            many, reply = ask(server.url, model, f"many-{run}", n)
            equal = len({choice["text"] for choice in reply["choices"]}) == 1
            print(f"run {run}: prompt {single['usage']['prompt_tokens']} tokens; n=1 {one:.2f} s, n={n} {many:.2f} s "
                  f"({many / one:.2f}x), greedy choices equal: {equal}", flush=True)


if __name__ == "__main__":
    main()
