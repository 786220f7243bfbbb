"""OpenAI's batch file, run offline through the server's own app (`specdecode batch`; vLLM's `run_batch`).

An extraction pipeline fills one schema for thousands of inputs: it writes them as OpenAI batch lines and wants one
result line per request (batch_file.py). Each body goes to the app of app.py in this process (no socket), so it is
checked, decoded and answered exactly as `serve` would answer it: continuous batching, every drafter, structured
outputs; the suffix drafter's store learns from the earlier answers as a server's does. Results are written in the
input's order, as soon as each one and all before it are done. No line is dropped: every input line gets its output
line. A running server takes the same files through the Batches API (batches.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from specdecode.server.app import Service, create_app
from specdecode.server.batch_file import BatchRequest, answer, app_client, read_requests

__all__ = ["BatchRequest", "read_requests", "run_batch"]


async def run_batch(service: Service, requests: list[BatchRequest], concurrency: int) -> AsyncIterator[dict]:
    """Each request's result line, in input order, with at most `concurrency` requests in the app at once (enough
    to keep the batch full; one the queue refuses waits and is sent again). The service's scheduler runs for the
    duration (the app's lifespan is not run here)."""
    service.scheduler.start()
    try:
        async with app_client(create_app(service), service.config.api_key) as client:
            gate = asyncio.Semaphore(concurrency)
            tasks = [asyncio.create_task(answer(client, gate, request)) for request in requests]
            try:
                for task in tasks:
                    yield await task
            finally:
                for task in tasks:
                    task.cancel()
    finally:
        service.scheduler.stop()
