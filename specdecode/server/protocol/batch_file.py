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
import codecs
import json
import os
import uuid
from array import array
from collections.abc import Iterable, Iterator
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


def request_spans(lines: Iterable[bytes]) -> Iterator[tuple[int, int, int, bytes]]:
    """(line number, start, end, its bytes) of each line of a batch file that is not blank, from the file's lines
    in order as binary reads give them (each but the last ending in "\n": JSONL's lines end there, and a JSON
    string may hold U+2028 as it is). A byte order mark that begins the file is no part of its first line (as
    Python's utf-8-sig reads it): editors on Windows write one, and json.loads refuses it."""
    start = 0
    for number, raw in enumerate(lines, start=1):
        text = raw.removesuffix(b"\n")
        bom = len(codecs.BOM_UTF8) if number == 1 and text.startswith(codecs.BOM_UTF8) else 0
        if text[bom:].strip():
            yield number, start + bom, start + len(text), text[bom:]
        start += len(raw)


class FileBytes:
    """A file's bytes read where they lie (os.pread on an open descriptor), sliced like bytes: the offline batch's
    input, whose lines are read again when they are sent rather than held. A file cut short meanwhile reads short
    (that line is then no request), never a crash as a map of it would be."""

    def __init__(self, fd: int):
        self.fd = fd

    def __getitem__(self, span: slice) -> bytes:
        return os.pread(self.fd, span.stop - span.start, span.start)


@dataclass(frozen=True)
class BatchLines:
    """A batch file's requests, as where each line lies in it (24 bytes a line): a line is read again when its
    request is sent, so a batch of a million lines holds a million places, not a million parsed bodies."""

    data: bytes | FileBytes  # the file (the store's bytes, not a copy; or the file itself)
    spans: array  # line number, start and end of each request's line, one after another
    repeated: frozenset[int] = frozenset()  # requests whose custom_id an earlier line has

    def __len__(self) -> int:
        return len(self.spans) // 3

    def request(self, index: int) -> BatchRequest:
        number, start, end = self.spans[3 * index : 3 * index + 3]
        request = read_line(number, self.data[start:end].decode("utf-8", errors="replace"))
        return _used_before(request) if index in self.repeated else request


def checked_lines(lines: Iterable[bytes]) -> Iterator[tuple[int, int, BatchRequest, bool]]:
    """(start, end, request, repeated) of each line of a batch file that is not blank (lines: its binary reads, in
    order), read as `read_line` checks it; a custom_id used twice is an error on the later line (repeated), as
    results are matched to requests by it. UnicodeDecodeError (its start: the byte in the file) when a line is not
    UTF-8. The one check of a batch file's lines, offline (index_lines) and in the Batches API (batches.py)."""
    seen = set()
    for number, start, end, text in request_spans(lines):
        try:
            request = read_line(number, text.decode("utf-8"))
        except UnicodeDecodeError as error:
            raise UnicodeDecodeError(error.encoding, error.object, start + error.start, start + error.end,
                                     error.reason) from None
        repeated = request.error is None and request.custom_id in seen
        seen.add(request.custom_id)
        yield start, end, _used_before(request) if repeated else request, repeated


def _used_before(request: BatchRequest) -> BatchRequest:
    return BatchRequest(request.line, request.custom_id,
                        error=f"line {request.line}: custom_id {request.custom_id!r} is used by an earlier line")


def index_lines(lines: Iterable[bytes], data: bytes | FileBytes) -> BatchLines:
    """A batch file's lines (binary reads of `data`, in order), each checked once (checked_lines), then held only
    as its place (and, for a custom_id used twice, that it was). UnicodeDecodeError as checked_lines raises it."""
    spans, repeated = array("q"), set()
    for start, end, request, used_before in checked_lines(lines):
        if used_before:
            repeated.add(len(spans) // 3)
        spans.extend((request.line, start, end))
    return BatchLines(data, spans, frozenset(repeated))


def results_done(lines: Iterable[str], requests: BatchLines) -> int:
    """How many of `requests` already have their result among `lines`, the whole lines of an output that a run
    stopped part way wrote: results are written in input order, so they are the first requests' results, each
    line naming its request's custom_id (None for a line that is no request). ValueError, saying where, when the
    lines are not such a head of this batch's results."""
    done, rest = 0, iter(lines)
    for number, text in enumerate(rest, start=1):
        if number > len(requests):
            raise ValueError(f"it holds {number + sum(1 for _ in rest)} results, more than the {len(requests)} "
                             "requests")
        try:
            result = json.loads(text)
        except ValueError:
            raise ValueError(f"its line {number} is not JSON") from None
        custom_id = requests.request(number - 1).custom_id
        if not isinstance(result, dict) or result.get("custom_id", "") != custom_id:
            got = result.get("custom_id") if isinstance(result, dict) else None
            raise ValueError(f"its line {number} is the result of custom_id {got!r}, where the input's request "
                             f"{number} is {custom_id!r}")
        done = number
    return done


def result_text(line: dict) -> str:
    """A result line as written to an output file: compact JSON and a newline, so each begins with RESULT_START."""
    return json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n"


RESULT_START = b'{"id":"batch_req_'  # how result_text begins: answer and error_line put the id first


def begins_result(fragment: bytes) -> bool:
    """Whether `fragment` (a last line with no newline) may be a result line cut while result_text's line was
    written: it begins as one does, or is the start of that beginning. Anything else is not ours to cut."""
    return fragment.startswith(RESULT_START) or RESULT_START.startswith(fragment)


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
