"""OpenAI's batch file, run offline through the server's own app (`specdecode batch`; vLLM's `run_batch`).

An extraction pipeline fills one schema for thousands of inputs: it writes them as OpenAI batch lines and wants one
result line per request (batch_file.py). Each body goes to the app of app.py in this process (no socket), so it is
checked, decoded and answered exactly as `serve` would answer it: continuous batching, every drafter, structured
outputs; the suffix drafter's store learns from the earlier answers as a server's does. Results are written in the
input's order, as soon as each one and all before it are done. No line is dropped: every input line gets its output
line. The file is read where it lies: each line is parsed once to check it, and read and parsed again when it is
sent, so memory follows the requests in flight, not the file's length. A running server takes the same files
through the Batches API (batches.py).
"""
from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import AsyncIterator

from specdecode.server.app import create_app
from specdecode.server.protocol.batch_file import BatchLines, answer, app_client, index_lines
from specdecode.server.service import Service

__all__ = ["BatchLines", "index_lines", "run_batch"]


async def run_batch(service: Service, lines: BatchLines, concurrency: int, first: int = 0,
                    ahead: int | None = None) -> AsyncIterator[dict]:
    """Each request's result line from the `first` on, in input order, with at most `concurrency` requests in the
    app at once (enough to keep the batch full; one the queue refuses waits and is sent again), and at most `ahead`
    (default: 16 per request in flight, at least 256) read and started past the next line to write: a slow request
    holds at most that many finished results behind it, whatever the file's length. The service's scheduler runs
    for the duration (the app's lifespan is not run here)."""
    ahead = ahead or max(256, 16 * concurrency)
    service.scheduler.start()
    try:
        async with app_client(create_app(service), service.config.api_key) as client:
            gate = asyncio.Semaphore(concurrency)  # its waiters go in turn: the earliest lines first
            upcoming = iter(range(first, len(lines)))
            window: deque[asyncio.Task] = deque()

            def start(count: int) -> None:
                for index in itertools.islice(upcoming, count):
                    window.append(asyncio.create_task(answer(client, gate, lines.request(index))))
            try:
                start(ahead)
                while window:
                    line = await window.popleft()
                    start(1)
                    yield line
            finally:
                for task in window:
                    task.cancel()
    finally:
        service.scheduler.stop()
