"""OpenAI's Files and Batches APIs (`/v1/files`, `/v1/batches`) with the official `openai` client, on a tiny random
Llama: a batch's output file holds the server's own answer to each request, in the input's order, and its error
file every other line (refused, cancelled), so each input line is in exactly one of them; a file holding a line
that is not a request to the batch's endpoint fails the batch with an error per line and sends nothing; a batch
keeps at most its share of the rows busy; cancelling or outliving the window ends it with what was answered; and
the files' bounds and bad uploads are 4xx answers in OpenAI's shape."""
from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest
from fastapi import FastAPI

from specdecode.cli.main import build_parser, main
from specdecode.cli.serve import files_bytes
from specdecode.core.target import Target
from specdecode.server.stores import batches as batches_module
from specdecode.server.stores.batches import BatchCreate, Batches
from specdecode.server.stores.file_store import FILES_BYTES, FileStore
from tests.e2e.server_util import MODEL, openai_client, serving, tiny_service
from tests.tiny import tool_tokenizer

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}
BODIES = [CHAT, {**CHAT, "messages": [{"role": "user", "content": "Once upon a time"}]}, {**CHAT, "max_tokens": 3}]


@pytest.fixture(scope="module")
def target(tiny_model) -> Target:
    return Target(tiny_model, tool_tokenizer())


@pytest.fixture(scope="module")
def server(target):
    with serving(tiny_service(target, max_batch=4)) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def _file(bodies: list[dict], url: str = "/v1/chat/completions", prefix: str = "r") -> bytes:
    return "".join(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": url, "body": body}) + "\n"
                   for i, body in enumerate(bodies)).encode()


def _finished(client, batch_id: str, timeout_s: float = 120):
    deadline = time.monotonic() + timeout_s
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.05)


def _lines(client, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def _answer(body: dict) -> dict:
    """A chat answer without what differs between two answers to one request (ids, times)."""
    return {"choices": body["choices"], "usage": body["usage"]}


def test_a_batch_answers_each_request_as_the_server_does_in_the_inputs_order(server, client):
    expected = [httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json() for body in BODIES]
    refused = {**CHAT, "max_tokens": -1}
    upload = client.files.create(file=("in.jsonl", _file([*BODIES, refused])), purpose="batch")
    assert (upload.object, upload.purpose, upload.filename, upload.bytes) == ("file", "batch", "in.jsonl",
                                                                           len(_file([*BODIES, refused])))
    assert client.files.retrieve(upload.id).id == upload.id
    assert upload.id in [held.id for held in client.files.list(purpose="batch").data]
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"job": "test"})
    assert batch.status == "in_progress" and batch.metadata == {"job": "test"}
    done = _finished(client, batch.id)
    assert done.status == "completed" and done.errors is None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (4, 3, 1)
    assert done.completed_at >= done.in_progress_at >= done.created_at and done.expires_at > done.created_at
    answered, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert [line["custom_id"] for line in answered] == ["r0", "r1", "r2"]
    for line, answer in zip(answered, expected):
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert _answer(line["response"]["body"]) == _answer(answer)
    assert [line["custom_id"] for line in errors] == ["r3"]
    refusal = errors[0]["response"]
    assert refusal["status_code"] == 400 and refusal["body"]["error"]["param"] == "max_tokens"
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"
    assert done.id in [listed.id for listed in client.batches.list().data]


def test_a_file_with_a_line_that_is_no_request_fails_the_batch_and_sends_nothing(server, client):
    text = _file(BODIES[:1]) + b"not json\n" + _file([{"model": MODEL, "prompt": "x"}], "/v1/completions", "c")
    upload = client.files.create(file=("bad.jsonl", text), purpose="batch")
    counted = _requests(server)
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None
    assert [(error.line, error.code) for error in batch.errors.data] == [(2, "invalid_request"),
                                                                         (3, "invalid_request")]
    assert "not JSON" in batch.errors.data[0].message and "not the batch's endpoint" in batch.errors.data[1].message
    assert batch.output_file_id is None and batch.error_file_id is None
    assert _requests(server) == counted  # no request was sent
    empty = client.files.create(file=("empty.jsonl", b"\n"), purpose="batch")
    failed = client.batches.create(input_file_id=empty.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert failed.status == "failed" and failed.errors.data[0].code == "empty_file"


def _requests(server) -> float:
    """Chat completions answered so far, by /metrics."""
    total = 0.0
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("specdecode_requests_total{") and 'endpoint="chat_completions"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_cancelling_ends_a_batch_with_what_was_answered_and_an_error_line_for_the_rest(client):
    bodies = [{**CHAT, "max_tokens": 48, "messages": [{"role": "user", "content": f"story {i}"}]} for i in range(24)]
    upload = client.files.create(file=("long.jsonl", _file(bodies)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None
    done = _finished(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at is not None
    answered, errors = _lines(client, done.output_file_id), _lines(client, done.error_file_id)
    assert sorted(line["custom_id"] for line in answered + errors) == sorted(f"r{i}" for i in range(24))
    assert errors and all(line["error"]["code"] == "batch_cancelled" for line in errors)
    assert (done.request_counts.completed, done.request_counts.failed) == (len(answered), len(errors))
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: nothing to do
    with pytest.raises(openai.ConflictError, match="has ended"):
        client.batches.cancel(_finished(client, client.batches.create(
            input_file_id=client.files.create(file=("one.jsonl", _file(BODIES[:1])), purpose="batch").id,
            endpoint="/v1/chat/completions", completion_window="24h").id).id)


@pytest.mark.parametrize("request_body, param", [
    ({"endpoint": "/v1/embeddings"}, "endpoint"),
    ({"completion_window": "1h"}, "completion_window"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"output_expires_after": {"anchor": "created_at", "seconds": 3600}}, "output_expires_after"),
    ({"input_file_id": 7}, "input_file_id"),
])
def test_a_bad_batch_is_a_400_naming_the_field(server, client, request_body, param):
    upload = client.files.create(file=("in.jsonl", _file(BODIES[:1])), purpose="batch")
    body = {"input_file_id": upload.id, "endpoint": "/v1/chat/completions", "completion_window": "24h", **request_body}
    reply = httpx.post(server.url + "/v1/batches", json=body, timeout=30)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param, reply.text


def test_what_is_not_held_is_a_404_and_bad_queries_are_400s(server, client):
    for call in (lambda: client.files.retrieve("file-none"), lambda: client.files.content("file-none"),
                 lambda: client.files.delete("file-none"), lambda: client.batches.retrieve("batch_none"),
                 lambda: client.batches.cancel("batch_none"),
                 lambda: client.batches.create(input_file_id="file-none", endpoint="/v1/chat/completions",
                                               completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            call()
    for query, param in (("limit=0", "limit"), ("limit=" + "9" * 5000, "limit"), ("order=up", "order"),
                         ("after=file-none", "after")):
        reply = httpx.get(f"{server.url}/v1/files?{query}", timeout=30)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert httpx.get(f"{server.url}/v1/batches?limit=101", timeout=30).status_code == 400
    upload = client.files.create(file=("x.jsonl", b"{}\n"), purpose="batch")
    assert client.files.delete(upload.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)


def test_uploads_are_bounded_and_checked(target):
    with serving(tiny_service(target, files_bytes=1000)) as running:
        client = openai_client(running)
        first = client.files.create(file=("a.jsonl", b"x" * 600), purpose="batch")
        with pytest.raises(openai.APIStatusError, match="600 bytes, and the file store has 400 of 1000") as refused:
            client.files.create(file=("b.jsonl", b"y" * 600), purpose="batch")
        assert refused.value.status_code == 413
        client.files.delete(first.id)
        client.files.create(file=("b.jsonl", b"y" * 600), purpose="batch")  # room again
        with pytest.raises(openai.BadRequestError, match="purpose must be one of batch"):
            client.files.create(file=("c.jsonl", b"{}"), purpose="fine-tune")
        url = running.url + "/v1/files"
        for kwargs, status in (({"json": {"purpose": "batch"}}, 415),
                               ({"files": {"file": ("d.jsonl", b"{}")}, "data": {"purpose": "batch"},
                                 "headers": {"origin": "http://evil.example"}}, 403),
                               ({"files": {"file": ("d.jsonl", b"{}")}, "data": {"purpose": "batch", "x": "1"}}, 400),
                               ({"files": {"purpose": (None, "batch"), "file": (None, "not a file part")}}, 400),
                               ({"content": b"--b\r\nbroken", "headers": {"content-type":
                                                                          "multipart/form-data; boundary=b"}}, 400),
                               ({"files": {"file": ("e.jsonl", b"z" * 5000)}, "data": {"purpose": "batch"}}, 413)):
            reply = httpx.post(url, timeout=30, **kwargs)
            assert reply.status_code == status, (kwargs, reply.text)
            assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
        same = httpx.post(url, files={"file": ("f.jsonl", b"{}")}, data={"purpose": "batch"},
                          headers={"origin": running.url}, timeout=30)
        assert same.status_code == 200  # the server's own page may upload
    with serving(tiny_service(target, files_bytes=0)) as running:
        client = openai_client(running)
        with pytest.raises(openai.BadRequestError, match="keeps no files"):
            client.files.create(file=("a.jsonl", b"{}"), purpose="batch")
        with pytest.raises(openai.BadRequestError, match="keeps no files"):
            client.batches.list()
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_x")


# -- the gate, the window and shutdown, on an app that only waits ---------------------------------------------------
def _slow_app(seconds: float, seen: dict) -> FastAPI:
    """An app whose chat endpoint answers after `seconds`, recording the most requests it held at once."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def answer() -> dict:
        seen["now"] = seen.get("now", 0) + 1
        seen["most"] = max(seen.get("most", 0), seen["now"])
        try:
            await asyncio.sleep(seconds)
        finally:
            seen["now"] -= 1
        return {"ok": True}
    return app


def _run(files: FileStore, batches: Batches, app: FastAPI, count: int, until) -> dict:
    async def go() -> dict:
        held = files.add("in.jsonl", "batch", _file([CHAT] * count))
        job = await batches.create(BatchCreate(input_file_id=held.id, endpoint="/v1/chat/completions",
                                               completion_window="24h"), app)
        await until(job)
        while job.status not in ("completed", "expired", "cancelled", "failed"):
            await asyncio.sleep(0.01)
        return job.card()
    return asyncio.run(go())


def _lines_of(files: FileStore, file_id: str | None) -> list[dict]:
    return [] if file_id is None else [json.loads(line) for line in files.get(file_id).data.decode().splitlines()]


def test_a_batch_keeps_at_most_its_share_of_requests_in_flight():
    seen: dict = {}
    files = FileStore(FILES_BYTES)
    card = _run(files, Batches(files, concurrency=2, api_key=None), _slow_app(0.02, seen), 8,
                lambda job: asyncio.sleep(0))
    assert card["status"] == "completed" and card["request_counts"]["completed"] == 8
    assert seen["most"] == 2


def test_a_batch_past_its_window_expires_with_an_error_line_for_each_request_left(monkeypatch):
    monkeypatch.setattr(batches_module, "WINDOW_S", 0.3)
    files = FileStore(FILES_BYTES)
    card = _run(files, Batches(files, concurrency=1, api_key=None), _slow_app(0.1, {}), 10,
                lambda job: asyncio.sleep(0))
    assert card["status"] == "expired" and card["expired_at"] is not None
    answered, errors = _lines_of(files, card["output_file_id"]), _lines_of(files, card["error_file_id"])
    assert len(answered) <= 4 and len(answered) + len(errors) == 10  # one request at a time, 0.1 s each
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


def test_shutting_down_cancels_a_running_batch_and_keeps_what_it_answered():
    files = FileStore(FILES_BYTES)
    batches = Batches(files, concurrency=1, api_key=None)

    async def shut(job) -> None:
        while job.completed < 1:  # one answered, whatever the machine's speed
            await asyncio.sleep(0.01)
        await batches.close()
    card = _run(files, batches, _slow_app(0.05, {}), 20, shut)
    assert card["status"] == "cancelled"
    answered, errors = _lines_of(files, card["output_file_id"]), _lines_of(files, card["error_file_id"])
    assert answered and errors and len(answered) + len(errors) == 20


def test_a_batch_holds_room_for_its_results_and_stops_where_they_would_pass_the_store():
    """Answers can be far larger than their requests: a running batch holds its results' bytes in the file store,
    and one whose results would pass the room stops there, with an error line for each line left (before, the
    results were held, and written past the store's capacity, however large)."""
    app, rooms = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def answer() -> dict:
        rooms.append(files.room())
        return {"content": "x" * 1000}
    files = FileStore(8000)
    card = _run(files, Batches(files, concurrency=1, api_key=None), app, 20, lambda job: asyncio.sleep(0))
    assert card["status"] == "failed" and card["errors"]["data"][0]["code"] == "batch_output_too_large"
    answered, errors = _lines_of(files, card["output_file_id"]), _lines_of(files, card["error_file_id"])
    assert 3 <= len(answered) <= 6 and len(answered) + len(errors) == 20, (len(answered), len(errors))
    assert {line["error"]["code"] for line in errors} == {"batch_output_too_large"}
    assert card["request_counts"] == {"total": 20, "completed": len(answered), "failed": len(errors)}
    assert rooms[-1] <= rooms[0] - 1000 * (len(rooms) - 1)  # each answer held its room while the batch ran
    assert files.reserved == 0  # and gave it to the files


def test_an_upload_being_read_holds_its_room(target):
    """Uploads read side by side each had the whole room before any was kept, so together they could make the
    server hold many times the store's bytes: an upload being read holds its declared size aside, a second that
    does not fit beside it is a 413 at once, and the room comes back when the first ends (here: its client left)."""
    with serving(tiny_service(target, files_bytes=1000)) as running:
        host, port = running.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as held:
            held.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; "
                         "boundary=b\r\nContent-Length: 700\r\n\r\n--b\r\n".encode())
            client = openai_client(running)
            deadline = time.monotonic() + 30
            while True:  # (the server reads the first upload's head on its own time)
                try:
                    client.files.create(file=("b.jsonl", b"y" * 600), purpose="batch")
                except openai.APIStatusError as refused:
                    assert refused.status_code == 413 and "held for uploads being read" in str(refused)
                    break
                assert time.monotonic() < deadline, "the second upload was never refused"
                time.sleep(0.05)  # the first upload's head had not arrived: the second was kept
                for held_file in client.files.list().data:
                    client.files.delete(held_file.id)
        deadline = time.monotonic() + 30
        while True:  # the first upload's room is back once the server sees its client gone
            try:
                client.files.create(file=("b.jsonl", b"y" * 600), purpose="batch")
                break
            except openai.APIStatusError as refused:
                assert refused.status_code == 413 and time.monotonic() < deadline
                time.sleep(0.05)


def test_an_upload_that_declares_no_size_holds_what_has_arrived(target):
    """A chunked upload (no Content-Length) held the whole room while it was read, so one slow client made every
    other upload a 413: it holds what has arrived, and is itself a 413 once that would pass the room."""
    def chunk(data: bytes) -> bytes:
        return f"{len(data):x}\r\n".encode() + data + b"\r\n"
    with serving(tiny_service(target, files_bytes=1000)) as running:
        files = running.app.state.service.files
        host, port = running.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as slow:
            slow.sendall(f"POST /v1/files HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; "
                         "boundary=b\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
                         + chunk(b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
                                 + b"x" * 100))
            deadline = time.monotonic() + 30
            while files.reserved == 0:  # (the server reads the slow upload's first chunk on its own time)
                assert time.monotonic() < deadline, "the slow upload's first chunk was never read"
                time.sleep(0.01)
            assert files.reserved < 300
            kept = openai_client(running).files.create(file=("b.jsonl", b"y" * 600), purpose="batch")
            assert kept.bytes == 600
            slow.sendall(chunk(b"x" * 70_000))  # past the room left (and the form's allowance)
            reply = slow.recv(65536).decode()
            assert reply.startswith("HTTP/1.1 413") and "file_store_full" in reply, reply
        deadline = time.monotonic() + 30
        while files.reserved:  # its room is back once its request ends
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert files.room() == 400


def test_the_files_store_flag():
    """Replicas share no memory, so a batch on one could not read a file uploaded to another."""
    parse = build_parser().parse_args
    assert files_bytes(parse(["serve"])) == FILES_BYTES
    assert files_bytes(parse(["serve", "--files-store", "1MiB"])) == 1 << 20
    assert files_bytes(parse(["serve", "--files-store", "0"])) == 0
    assert files_bytes(parse(["serve", "--replicas", "2"])) == 0


def test_bad_files_store_flags_exit_2(capsys):
    assert main(["serve", "--replicas", "2", "--files-store", "1MiB"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--files-store needs a single server" in err and "\n" not in err
    with pytest.raises(SystemExit) as parsed:
        main(["serve", "--files-store", "lots"])
    assert parsed.value.code == 2 and "expected a size like" in capsys.readouterr().err


def test_a_running_batch_holds_its_workers_not_a_task_for_each_request():
    """A task for each request (and each request parsed and held) made a batch of 200,000 lines hold ~560 MiB and
    its creation stall the event loop; its `concurrency` workers read each line when they take it."""
    tasks: list[int] = []

    async def count(job) -> None:
        await asyncio.sleep(0.05)
        tasks.append(len(asyncio.all_tasks()))
    files = FileStore(FILES_BYTES)
    card = _run(files, Batches(files, concurrency=2, api_key=None), _slow_app(0.001, {}), 300, count)
    assert card["status"] == "completed" and card["request_counts"] == {"total": 300, "completed": 300, "failed": 0}
    assert tasks and tasks[0] < 20, tasks
    assert [line["custom_id"] for line in _lines_of(files, card["output_file_id"])] == [f"r{i}" for i in range(300)]


def test_lines_end_at_newlines_only_and_a_file_holds_at_most_50000_requests():
    """JSONL's lines end at "\\n": a JSON string may hold U+2028 as it is, which str.splitlines took for a line
    break (two broken lines, the batch failed). Past OpenAI's 50,000 requests a file fails the batch."""
    files = FileStore(FILES_BYTES)
    batches = Batches(files, concurrency=2, api_key=None)
    odd = {**CHAT, "messages": [{"role": "user", "content": "one\u2028two\u2029three\x85four"}]}
    text = "".join(json.dumps({"custom_id": f"u{i}", "method": "POST", "url": "/v1/chat/completions", "body": odd},
                              ensure_ascii=False) + "\r\n" for i in range(2)).encode()

    async def go(data: bytes) -> dict:
        held = files.add("in.jsonl", "batch", data)
        job = await batches.create(BatchCreate(input_file_id=held.id, endpoint="/v1/chat/completions",
                                               completion_window="24h"), _slow_app(0.001, {}))
        while job.status not in ("completed", "failed"):
            await asyncio.sleep(0.01)
        return job.card()
    card = asyncio.run(go(text))
    assert card["status"] == "completed" and card["request_counts"]["completed"] == 2, card
    many = asyncio.run(go(b"{}\n" * (batches_module.MAX_REQUESTS + 1)))
    assert many["status"] == "failed" and many["errors"]["data"][0]["code"] == "invalid_file"
    assert "more than 50000 requests" in many["errors"]["data"][0]["message"]
    latin1 = asyncio.run(go(text + b'{"custom_id": "caf\xe9"}\n'))  # the bad byte: 18 into the third line
    error = latin1["errors"]["data"][0]
    assert latin1["status"] == "failed" and error["code"] == "invalid_file"
    assert f"not UTF-8 text (invalid continuation byte at byte {len(text) + 18})" in error["message"]


def test_a_failed_batch_lists_its_first_100_errors_and_counts_the_rest():
    """Every batch is kept with its errors: a file of 50,000 bad lines held 15 MiB of them per batch."""
    files = FileStore(FILES_BYTES)
    held = files.add("bad.jsonl", "batch", b"not json\n" * 250)
    job = asyncio.run(Batches(files, concurrency=1, api_key=None).create(
        BatchCreate(input_file_id=held.id, endpoint="/v1/chat/completions", completion_window="24h"), FastAPI()))
    errors = job.card()["errors"]["data"]
    assert job.status == "failed" and len(errors) == 101 and errors[99]["line"] == 100
    assert errors[100]["line"] is None and errors[100]["message"].startswith("150 more lines are not requests")
