"""OpenAI's batch file, run offline through the server's own app (`specdecode batch`; vLLM's `run_batch`).

An extraction pipeline fills one schema for thousands of inputs: it writes them as OpenAI batch lines, `{"custom_id",
"method": "POST", "url": "/v1/chat/completions", "body": {...}}`, and wants one result line per request. Each body
goes to the app of app.py in this process (no socket), so it is checked, decoded and answered exactly as `serve`
would answer it: continuous batching, every drafter, structured outputs; the suffix drafter's store learns from
the earlier answers as a server's does. Results are written in the input's order, as soon as each one and all
before it are done:
    {"id": "batch_req_...", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}
A request the app refuses keeps its status and error body in `response`, as does a bug's 500; a line that is not a
request (not JSON, no `custom_id` or one an earlier line used, a method or url the batch does not serve, a streamed
body) gets `response` null and `error` {"code", "message"}. No line is dropped: every input line gets its output
line.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from specdecode.server.app import Service, create_app

URLS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
RETRY_S = 0.05  # the wait before a request the queue refused (429) is sent again


@dataclass(frozen=True)
class BatchRequest:
    """One input line, read: a request to send, or why it is not one (error)."""

    line: int  # 1-based
    custom_id: str | None
    url: str | None = None
    body: dict[str, Any] | None = None
    error: str | None = None


def read_line(number: int, text: str) -> BatchRequest:
    """One line of the batch file, checked as OpenAI checks it before a batch runs."""
    try:
        raw = json.loads(text)
    except ValueError as error:
        return BatchRequest(number, None, error=f"line {number} is not JSON ({error.msg})")
    if not isinstance(raw, dict):
        return BatchRequest(number, None, error=f"line {number} is not a JSON object")
    custom_id = raw.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchRequest(number, None, error=f"line {number} has no custom_id (a non-empty string)")
    method, url, body = raw.get("method"), raw.get("url"), raw.get("body")
    problem = None
    if method != "POST":
        problem = f"method must be \"POST\", got {json.dumps(method)[:40]}"
    elif url not in URLS:
        problem = f"url must be one of {', '.join(URLS)}, got {json.dumps(url)[:80]}"
    elif not isinstance(body, dict):
        problem = "body must be a JSON object"
    elif body.get("stream"):
        problem = "body.stream is not supported in a batch (each result is written whole)"
    if problem is not None:
        return BatchRequest(number, custom_id, error=f"line {number}: {problem}")
    return BatchRequest(number, custom_id, url, body)


def read_requests(lines: Iterable[str]) -> list[BatchRequest]:
    """The batch file's lines (blank ones skipped), each read; a custom_id used twice is an error on the later
    line, as results are matched to requests by it."""
    requests, seen = [], set()
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        request = read_line(number, text)
        if request.error is None and request.custom_id in seen:
            request = BatchRequest(number, request.custom_id,
                                   error=f"line {number}: custom_id {request.custom_id!r} is used by an earlier line")
        seen.add(request.custom_id)
        requests.append(request)
    return requests


async def run_batch(service: Service, requests: list[BatchRequest], concurrency: int) -> AsyncIterator[dict]:
    """Each request's result line, in input order, with at most `concurrency` requests in the app at once (enough
    to keep the batch full; one the queue refuses waits and is sent again). The service's scheduler runs for the
    duration (the app's lifespan is not run here)."""
    service.scheduler.start()
    try:
        # a bug's 500 is a result line like any answer (Starlette raises the error again after answering it)
        transport = httpx.ASGITransport(app=create_app(service), raise_app_exceptions=False)
        headers = {"authorization": f"Bearer {service.config.api_key}"} if service.config.api_key else {}
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers,
                                     timeout=None) as client:
            gate = asyncio.Semaphore(concurrency)
            tasks = [asyncio.create_task(_result(client, gate, request)) for request in requests]
            try:
                for task in tasks:
                    yield await task
            finally:
                for task in tasks:
                    task.cancel()
    finally:
        service.scheduler.stop()


async def _result(client: httpx.AsyncClient, gate: asyncio.Semaphore, request: BatchRequest) -> dict:
    line = {"id": "batch_req_" + uuid.uuid4().hex, "custom_id": request.custom_id, "response": None, "error": None}
    if request.error is not None:
        line["error"] = {"code": "invalid_request", "message": request.error}
        return line
    async with gate:
        while True:
            reply = await client.post(request.url, json=request.body)
            if reply.status_code != 429:
                break
            await asyncio.sleep(RETRY_S)
    line["response"] = {"status_code": reply.status_code, "request_id": "req_" + uuid.uuid4().hex,
                        "body": reply.json()}
    return line
