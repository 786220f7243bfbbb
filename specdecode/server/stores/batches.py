"""The Batches API's batches (OpenAI's `/v1/batches`): `specdecode batch` (batch.py), run by a running server.

A client uploads a batch file (file_store.py), creates a batch naming it, polls the batch, and reads its output
file. The file is read and checked when the batch is created: every line as `specdecode batch` checks it, and its
url must be the batch's endpoint. A file with any line that is not a request fails the batch at once, with one error
per such line (`errors.data`: code, message, line), and nothing is sent, as OpenAI's validation does.

Otherwise the requests go to this server's own app in this process (batch_file.answer), through one gate shared by
every batch: at most `concurrency` batch requests at once (serve's default: half of --max-batch, at least one), so
interactive clients keep the other rows. A running batch holds where each line lies in its file (24 bytes a line),
and reads a line again when one of its `concurrency` workers takes it. Parsed requests and a task for each had
made eight batches of one 6.8 MB file of 50,000 lines raise the server's RSS by 1,040 MiB and stall its event loop
(`/health` answered in 2.05 s); now 59 MiB and 0.03 s. A file holds at most 50,000 requests, OpenAI's limit, and
its lines end at "\n" (a JSON string may hold U+2028 as it is). The batch is `in_progress` from its creation; its
request_counts grow as requests finish. Its results are written when it ends, in the input's order: the 200s to its
output file, the others (refused, a bug's 500, never sent) to its error file, so every line of the input is in one
of them.

While it runs, a batch holds each result as its line of JSON and holds that much room in the file store, which its
output files will take (FileStore.reserve). Answers are far larger than the requests that ask for them (a line of
200 bytes may ask for 20 logprobs of every token), so the results, not the input, bound a batch's memory. Held as
parsed replies until the batch ended, and never refused, 2,000 answers of 100 KB (from a stub app) grew the process
by 517 MiB at its peak with a 1 MiB store, which then held 191 MiB; now 4 MiB (the batch stops after 7 answers), and
353 MiB with a 256 MiB store that takes them all (the results and their file side by side while it is written).
A batch whose results would pass the room stops there (`failed`, its errors naming the store): what
was answered is written, and each line left is an error line (`batch_output_too_large`), as when a batch is
cancelled.

Cancelling a batch cancels its requests in flight and sends no more; what was answered is written, and each line
not answered is an error line (`batch_cancelled`). A batch not done within its completion window (24 h) ends the same
way (`batch_expired`). The server keeps the last `kept` batches (the oldest finished one is dropped first, with its
files kept); all of it in memory, none of it outliving the process.
"""
from __future__ import annotations

import asyncio
import io
import logging
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict

from specdecode.server.protocol.batch_file import (
    URLS,
    BatchLines,
    answer,
    app_client,
    checked_lines,
    error_line,
    result_text,
)
from specdecode.server.protocol.errors import APIError, bad_request, shown
from specdecode.server.protocol.schemas import Metadata
from specdecode.server.stores.file_store import OUTPUT_PURPOSE, FileStore

log = logging.getLogger(__name__)

BATCHES_KEPT = 1024
MAX_REQUESTS = 50_000  # requests one batch file may hold (OpenAI's limit)
# a failed batch lists the errors of its first lines that are not requests, then one that counts the rest: every
# batch is kept (up to BATCHES_KEPT) with its errors, and a file of 50,000 bad lines held 15 MiB of them
ERRORS_LISTED = 100
WINDOW = "24h"  # OpenAI's only completion window
WINDOW_S = 24 * 3600
ENDED = ("failed", "completed", "expired", "cancelled")


class BatchCreate(BaseModel):
    """POST /v1/batches' body. OpenAI's `output_expires_after` is not implemented (files are kept until deleted):
    like any field not listed, it is a 400."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Metadata | None = None


@dataclass
class BatchJob:
    """One batch, as OpenAI's batch object tells it; `times` holds the moments it reached (in_progress_at, ...)."""

    id: str
    endpoint: str
    input_file_id: str
    created_at: int
    metadata: dict[str, str] | None
    status: str = "in_progress"
    errors: list[dict] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    times: dict[str, int] = field(default_factory=dict)
    total: int = 0
    completed: int = 0
    failed: int = 0
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # set by cancel()
    task: asyncio.Task | None = None
    began: float = field(default_factory=time.monotonic)  # its window's start, on the clock that times it

    @property
    def expires_at(self) -> int:
        return self.created_at + WINDOW_S

    def reach(self, status: str) -> None:
        self.status = status
        self.times[f"{status}_at"] = int(time.time())

    def card(self) -> dict:
        """OpenAI's batch object."""
        moments = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
        errors = None if self.errors is None else {"object": "list", "data": self.errors}
        return {"id": self.id, "object": "batch", "endpoint": self.endpoint, "errors": errors,
                "input_file_id": self.input_file_id, "completion_window": WINDOW, "status": self.status,
                "output_file_id": self.output_file_id, "error_file_id": self.error_file_id,
                "created_at": self.created_at, "expires_at": self.expires_at,
                **{f"{moment}_at": self.times.get(f"{moment}_at") for moment in moments},
                "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
                "metadata": self.metadata}


class Batches:
    """The server's batches by id, oldest first. Used from the server's event loop only (no lock)."""

    def __init__(self, files: FileStore, concurrency: int, api_key: str | None, host: str = "127.0.0.1",
                 kept: int = BATCHES_KEPT):
        """host: the Host the batches' requests carry (one the app answers)."""
        if concurrency < 1 or kept < 1:
            raise ValueError(f"batches need concurrency >= 1 and kept >= 1, got {concurrency}, {kept}")
        self.files, self.concurrency, self.api_key, self.host, self.kept = files, concurrency, api_key, host, kept
        self._jobs: dict[str, BatchJob] = {}
        self._gate: asyncio.Semaphore | None = None  # made in the server's loop, on the first batch

    async def create(self, body: BatchCreate, app: Any) -> BatchJob:
        """A batch of the file `body` names, started on `app` (the ASGI app its requests go to); failed at once when
        the file holds a line that is not a request. A 4xx for a body that names no batch file. The file is read in
        a thread of its own: a large one must not stall the streams."""
        _check(body)
        held = self.files.get(body.input_file_id)
        if held is None:
            raise APIError(404, f"no file with id {shown(body.input_file_id)} is held here", "not_found_error",
                           param="input_file_id", code="file_not_found")
        if held.purpose != "batch":
            raise bad_request(f"file {held.id} has purpose {held.purpose!r}; a batch reads a file uploaded with "
                              f"purpose 'batch'", "input_file_id", "invalid_value")
        spans, errors = await asyncio.to_thread(_read, held.data, body.endpoint)
        self._make_room()
        job = BatchJob("batch_" + uuid.uuid4().hex, body.endpoint, held.id, int(time.time()), body.metadata)
        self._jobs[job.id] = job
        job.total = len(spans) // 3
        if errors:
            job.errors = errors
            job.reach("failed")
            return job
        job.reach("in_progress")
        lines = BatchLines(held.data, spans)  # 24 bytes a line
        job.task = asyncio.get_running_loop().create_task(self._guarded(job, lines, app))
        return job

    def get(self, batch_id: str) -> BatchJob | None:
        return self._jobs.get(batch_id)

    def held(self) -> list[BatchJob]:
        """Every batch kept, oldest first."""
        return list(self._jobs.values())

    def cancel(self, job: BatchJob) -> None:
        """Ask a running batch to end; it is `cancelling` until its requests in flight have stopped."""
        if job.status == "in_progress":
            job.reach("cancelling")
            job.stop.set()

    async def close(self) -> None:
        """Stop every running batch (the server is shutting down)."""
        running = [job for job in self._jobs.values() if job.task is not None and not job.task.done()]
        for job in running:
            self.cancel(job)
        await asyncio.gather(*(job.task for job in running), return_exceptions=True)

    def _make_room(self) -> None:
        if len(self._jobs) < self.kept:
            return
        ended = next((job for job in self._jobs.values() if job.status in ENDED), None)
        if ended is None:
            raise APIError(429, f"{len(self._jobs)} batches are running, the most this server keeps; wait for one "
                                "to end", "rate_limit_error", code="too_many_batches")
        del self._jobs[ended.id]

    async def _guarded(self, job: BatchJob, lines: BatchLines, app: Any) -> None:
        """_run, and a bug in it fails the batch (logged) rather than leaving it in progress for ever."""
        try:
            await self._run(job, lines, app)
        except Exception:
            log.exception("batch %s failed", job.id)
            job.errors = [{"code": "internal_error", "message": "the batch failed (the server logged why)",
                           "param": None, "line": None}]
            job.reach("failed")

    async def _run(self, job: BatchJob, lines: BatchLines, app: Any) -> None:
        if self._gate is None:
            self._gate = asyncio.Semaphore(self.concurrency)
        gate = self._gate
        results: list[bytes | None] = [None] * len(lines)  # by line: its result as a JSONL line, None while none
        answered = bytearray(len(lines))  # by line: 1 where its result is a 200 (the output file's)
        failed: set[int] = set()  # lines whose request raised (a bug: logged)
        pending = iter(range(len(lines)))  # shared by the workers: each takes the next line
        full = asyncio.Event()  # a result would have passed the file store's room
        held = 0  # bytes of results, held aside in the file store

        async def work(grow: Callable[[int], bool]) -> None:
            nonlocal held
            for index in pending:
                request = lines.request(index)
                try:
                    line = await answer(client, gate, request)
                except Exception:
                    log.exception("batch request %r was not answered", request.custom_id)
                    failed.add(index)
                    continue
                data = _jsonl([line])
                if not grow(held + len(data)):
                    full.set()
                    return
                held += len(data)
                results[index], answered[index] = data, _answered(line)
                if answered[index]:
                    job.completed += 1
                else:
                    job.failed += 1

        with self.files.reserve(0) as grow:
            async with app_client(app, self.api_key, self.host) as client:
                workers = [asyncio.create_task(work(grow)) for _ in range(min(self.concurrency, len(lines)))]
                every = asyncio.ensure_future(asyncio.gather(*workers, return_exceptions=True))
                stops = [asyncio.ensure_future(job.stop.wait()), asyncio.ensure_future(full.wait())]
                await asyncio.wait([every, *stops], timeout=max(0.0, job.began + WINDOW_S - time.monotonic()),
                                   return_when=asyncio.FIRST_COMPLETED)
                ending = "failed" if full.is_set() else "completed" if every.done() else \
                    "cancelled" if job.stop.is_set() else "expired"
                for waiting in (*stops, *workers):
                    waiting.cancel()
                await every
            job.reach("finalizing")
            # written in a thread of their own, as the file was read
            output, others = await asyncio.to_thread(_sorted_results, lines, results, answered, failed, ending)
        # the room held for the results is the files' now
        job.completed, job.failed = output.count(b"\n"), others.count(b"\n")
        for kind, data in (("output", output), ("error", others)):
            if data:
                setattr(job, f"{kind}_file_id", self.files.add(f"{job.id}_{kind}.jsonl", OUTPUT_PURPOSE, data).id)
        if full.is_set():
            job.errors = [{"code": "batch_output_too_large", "message": f"the batch's results passed the room "
                           f"left in the file store ({self.files.capacity} bytes, serve --files-store): it stopped "
                           "there, and its error file holds the lines it did not answer", "param": None,
                           "line": None}]
        job.reach(ending)


def _sorted_results(lines: BatchLines, results: list[bytes | None], answered: bytearray, failed: set[int],
                    ending: str) -> tuple[bytes, bytes]:
    """(the output file, the error file), in the input's order: every line's answer, or why it has none."""
    output, others = [], []
    for index, data in enumerate(results):
        if data is None:
            code, message = _NOT_SENT["completed" if index in failed else ending]()
            data = _jsonl([error_line(lines.request(index).custom_id, code, message)])
        (output if answered[index] else others).append(data)
    return b"".join(output), b"".join(others)


def _check(body: BatchCreate) -> None:
    if body.endpoint not in URLS:
        raise bad_request(f"endpoint must be one of {', '.join(URLS)}, got {shown(body.endpoint)}", "endpoint",
                          "invalid_value")
    if body.completion_window != WINDOW:
        raise bad_request(f"completion_window must be {WINDOW!r}, got {shown(body.completion_window)}",
                          "completion_window", "invalid_value")


def _read(data: bytes, endpoint: str) -> tuple[array, list[dict]]:
    """Where the file's requests lie (line number, start and end of each non-blank line, one after another; lines
    end at "\n", as JSONL's do), and an error for each line that is not a request to `endpoint` (OpenAI's shape),
    each line checked once as `specdecode batch` checks it (batch_file.checked_lines)."""
    spans, errors = array("q"), []
    try:
        for start, end, request, _ in checked_lines(io.BytesIO(data)):
            if len(spans) // 3 == MAX_REQUESTS:
                message = f"the file holds more than {MAX_REQUESTS} requests, the most a batch takes"
                return array("q"), [{"code": "invalid_file", "message": message, "param": None, "line": None}]
            message = request.error
            if message is None and request.url != endpoint:
                message = f"line {request.line}: url {request.url} is not the batch's endpoint {endpoint}"
            if message is not None:
                errors.append({"code": "invalid_request", "message": message, "param": None, "line": request.line})
            spans.extend((request.line, start, end))
    except UnicodeDecodeError as error:
        return array("q"), [{"code": "invalid_file", "message": f"the file is not UTF-8 text ({error.reason} at byte "
                                                                f"{error.start})", "param": None, "line": None}]
    if not spans:
        return spans, [{"code": "empty_file", "message": "the file holds no requests", "param": None, "line": None}]
    if len(errors) > ERRORS_LISTED:
        more = len(errors) - ERRORS_LISTED
        errors = [*errors[:ERRORS_LISTED], {"code": "invalid_request", "message": f"{more} more lines are not "
                  f"requests (the first {ERRORS_LISTED} are listed)", "param": None, "line": None}]
    return spans, errors


def _jsonl(lines: list[dict]) -> bytes:
    return "".join(result_text(line) for line in lines).encode()


def _answered(line: dict) -> bool:
    """A result line for the output file (a 200), not the error file."""
    return line["response"] is not None and line["response"]["status_code"] == 200


_NOT_SENT: dict[str, Callable[[], tuple[str, str]]] = {
    "cancelled": lambda: ("batch_cancelled", "the batch was cancelled before this request was answered"),
    "expired": lambda: ("batch_expired", f"the batch's {WINDOW} window ended before this request was answered"),
    "completed": lambda: ("internal_error", "the request was not answered (the server logged why)"),
    "failed": lambda: ("batch_output_too_large", "the batch stopped before this request was answered: its results "
                                                 "passed the room in the file store (serve --files-store)"),
}
