"""`specdecode bench-serve`: throughput and latency of the server at several concurrency levels, with
speculation on (the server's drafter and K policy) and off (`"speculation": {"drafter": "none"}`), measured in
the same run against the same server, alternating per level. Greedy chat requests over the benchmark prompts (each
question's first turn, or with --conversations all its turns in order: serve_client.conversation); greedy output
does not depend on speculation, so both modes generate the same tokens.

Prints a markdown table. The client (serve_client.py) is the standard library, so it also runs against any
OpenAI-compatible server given with --url; against a server bench-serve starts, it runs in a process of its own.
"""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor

from specdecode.bench.serve_client import Level, bench_at
from specdecode.server.app import create_app
from specdecode.server.background import BackgroundServer
from specdecode.server.service import ServeConfig, build_service


def bench_served(config: ServeConfig, prompts: list[tuple[str, ...]], concurrency: list[int], requests: int | None,
                 max_tokens: int) -> list[Level]:
    """Start a server as configured on a free local port, benchmark it (serve_client.bench, each level and mode
    with a cache_salt of its own: this server keeps prompts' KV for later requests), stop it. The clients
    are a process of their own (spawned: it imports no torch): as threads of the server's process they took its
    CPU and its GIL from the server's event loop and its decoding thread."""
    service = build_service(config)
    with BackgroundServer(create_app(service)) as server:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as clients:
            return clients.submit(bench_at, server.url, service.config.model_name, prompts, concurrency, requests,
                                  max_tokens, True).result()
