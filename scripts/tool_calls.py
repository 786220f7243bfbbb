"""Tool calls on the Qwen2.5-Coder 1.5B server (CPU default weights, prompt lookup): how many of six agent-style
requests "auto" reads a call from, and what forced calls ("required") cost with speculation and without (k 0),
over the six requests, each pass alternated (docs/serving.md, "Tool calls").

    .venv/bin/python scripts/tool_calls.py [rounds]
"""
from __future__ import annotations

import sys
import time

import httpx

from specdecode.config import DrafterConfig, ModelConfig
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.service import ServeConfig, build_service


def _tool(name: str, description: str, **properties: dict) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties}}}


TOOLS = [_tool("get_weather", "Get the current weather in a city", city={"type": "string"},
               unit={"type": "string", "enum": ["celsius", "fahrenheit"]}),
         _tool("read_file", "Read a file of the repository", path={"type": "string"}),
         _tool("run_tests", "Run the test suite, or one test file", path={"type": "string"})]
ASKS = ["What's the weather like in Paris today?", "Show me what is in src/app.py.",
        "Run the tests in tests/test_api.py, please.", "Is it raining in Rome?",
        "Open README.md and tell me what it says.", "Check whether the test suite passes."]


def ask(url: str, model: str, text: str, **extra) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": text}], "tools": TOOLS, "max_tokens": 64,
            "temperature": 0, **extra}
    reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    return reply.json()


def calls(reply: dict) -> list[tuple[str, str]]:
    return [(call["function"]["name"], call["function"]["arguments"])
            for call in reply["choices"][0]["message"].get("tool_calls") or []]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    config = ServeConfig(ModelConfig("qwen2.5-coder-1.5b"), DrafterConfig("prompt-lookup")).resolved()
    service = build_service(config)
    model = service.config.model_name
    with BackgroundServer(create_app(service)) as server:
        ask(server.url, model, "hi", tool_choice="required", max_tokens=8)  # the grammar engine's tokenizer, once
        auto = [calls(ask(server.url, model, text)) for text in ASKS]
        print(f"auto: a call read from {sum(bool(one) for one in auto)} of {len(ASKS)} replies")
        for one in auto:
            print("   ", one)
        for run in range(rounds):
            for k in (None, 0):
                extra = {} if k is None else {"speculation": {"k": 0}}
                began, tokens, passes, forced, same = time.perf_counter(), 0, 0, 0, 0
                for text, free in zip(ASKS, auto):
                    reply = ask(server.url, model, text, tool_choice="required", **extra)
                    usage = reply["usage"]
                    tokens, passes = tokens + usage["completion_tokens"], passes + usage["target_passes"]
                    forced, same = forced + usage["forced_tokens"], same + (calls(reply) == free)
                seconds = time.perf_counter() - began
                print(f"run {run} required, {'k 0' if k == 0 else 'speculation'}: {tokens} tokens, {passes} passes, "
                      f"{forced} forced, {seconds:.2f} s, {tokens / seconds:.1f} tokens/s (prefill included); "
                      f"{same}/{len(ASKS)} calls as auto's")


if __name__ == "__main__":
    main()
