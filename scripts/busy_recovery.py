"""A server that starts on a busy machine drafts normally once the load goes away (docs/design-notes.md, "Costs
that follow the machine"): the default model's server is started while `--busy` processes spin on the CPU, answers
a repeat-the-passage request a few times, the load stops, and the same request is asked every `--every` seconds;
then a server started quiet answers it. Each answer's accepted draft tokens (completion tokens less target passes)
and the row cost the drafters planned with (/metrics) are printed.

    .venv/bin/python scripts/busy_recovery.py [--busy 1] [--every 10] [--for 60]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time

import httpx

from specdecode.config import DrafterConfig, ModelConfig
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.service import ServeConfig, build_service

PASSAGE = ("The river rose slowly through the night, and by morning the lower fields were under water. The farmers "
           "moved their animals to the hill behind the church, where the ground stayed dry, and the children carried "
           "bread and blankets up the muddy path. Nobody in the village could remember a flood like it, although the "
           "oldest woman said her grandmother had told of one that reached the windows of the mill.")


def ask(url: str, model: str) -> str:
    """One greedy repeat request: its accepted draft tokens and the row cost /metrics shows after it."""
    body = {"model": model, "max_tokens": 120, "temperature": 0,
            "messages": [{"role": "user", "content": f"Repeat this passage word for word:\n\n{PASSAGE}"}]}
    usage = httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()["usage"]
    metrics = httpx.get(url + "/metrics", timeout=60).text
    cost = re.search(r"^specdecode_row_cost (\S+)$", metrics, re.M)
    accepted = usage["completion_tokens"] - usage["target_passes"]
    return f"accepted {accepted} of {usage['completion_tokens']} tokens, row cost {cost.group(1) if cost else '?'}"


def busy(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", type=int, default=1, help="busy processes while the server starts (default 1)")
    parser.add_argument("--every", type=float, default=10.0, help="seconds between requests after the load stops")
    parser.add_argument("--for", dest="span", type=float, default=60.0, help="seconds to follow after the load")
    args = parser.parse_args()
    config = ServeConfig(ModelConfig(), DrafterConfig("prompt-lookup")).resolved()
    loops = busy(args.busy)
    try:
        time.sleep(1.0)
        service = build_service(config)  # loaded, and its row cost measured at start-up, on the busy machine
        with BackgroundServer(create_app(service)) as server:
            for _ in range(3):
                print("busy:", ask(server.url, service.config.model_name), flush=True)
            for loop in loops:
                loop.kill()
            stopped = time.monotonic()
            while (after := time.monotonic() - stopped) < args.span:
                time.sleep(max(0.0, args.every - after % args.every))
                after = time.monotonic() - stopped
                print(f"{after:4.0f} s after the load:", ask(server.url, service.config.model_name), flush=True)
        del service, server
    finally:
        for loop in loops:
            loop.kill()
    service = build_service(config)
    with BackgroundServer(create_app(service)) as server:
        for _ in range(3):
            print("started quiet:", ask(server.url, service.config.model_name), flush=True)


if __name__ == "__main__":
    main()
