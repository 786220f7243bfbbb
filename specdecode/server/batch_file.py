"""OpenAI's batch file format: request lines in, result lines out. Read by `specdecode batch` (batch.py, offline)
and by the Batches API (batches.py, in a running server); both send each request to the server's own app.

A request line: `{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}`. A result line:
    {"id": "batch_req_...", "custom_id", "response": {"status_code", "request_id", "body"}, "error": null}
A request the app refuses keeps its status and error body in `response`, as does a bug's 500; a line that is not a
request, or one that was never sent (the batch was cancelled or expired), has `response` null and `error` {"code",
"message"}.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import httpx

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


def results_done(lines: list[str], requests: list[BatchRequest]) -> int:
    """How many of `requests` already have their result among `lines`, the whole lines of an output that a run
    stopped part way wrote: results are written in input order, so they are the first len(lines) requests, each
    line naming its request's custom_id (None for a line that is no request). ValueError, saying where, when the
    lines are not such a head of this batch's results."""
    for number, (text, request) in enumerate(zip(lines, requests), start=1):
        try:
            result = json.loads(text)
        except ValueError:
            raise ValueError(f"its line {number} is not JSON") from None
        if not isinstance(result, dict) or result.get("custom_id", "") != request.custom_id:
            got = result.get("custom_id") if isinstance(result, dict) else None
            raise ValueError(f"its line {number} is the result of custom_id {got!r}, where the input's request "
                             f"{number} is {request.custom_id!r}")
    if len(lines) > len(requests):
        raise ValueError(f"it holds {len(lines)} results, more than the {len(requests)} requests")
    return len(lines)


def error_line(custom_id: str | None, code: str, message: str) -> dict:
    """The result line of a request that was not answered: not a request, or never sent."""
    return {"id": "batch_req_" + uuid.uuid4().hex, "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


async def answer(client: httpx.AsyncClient, gate: asyncio.Semaphore, request: BatchRequest) -> dict:
    """The request's result line: sent once `gate` lets it in, and again while the queue refuses it (429)."""
    if request.error is not None:
        return error_line(request.custom_id, "invalid_request", request.error)
    async with gate:
        while True:
            reply = await client.post(request.url, json=request.body)
            if reply.status_code != 429:
                break
            await asyncio.sleep(RETRY_S)
    return {"id": "batch_req_" + uuid.uuid4().hex, "custom_id": request.custom_id, "error": None,
            "response": {"status_code": reply.status_code, "request_id": "req_" + uuid.uuid4().hex,
                         "body": reply.json()}}


def app_client(app: Any, api_key: str | None, host: str = "127.0.0.1") -> httpx.AsyncClient:
    """A client that sends to an ASGI app in this process (no socket), as a client of it would: with the API key,
    and a Host the app answers. A bug's 500 is answered like any status (Starlette raises the error again after
    answering it)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}", headers=headers, timeout=None)
