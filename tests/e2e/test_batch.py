"""`specdecode batch`: an OpenAI batch file run through the server's app in this process. Each request's result is
the live server's answer to the same body (greedy text, usage), in the input's order whatever order they finish
in; a request the app refuses keeps its status and error body, and a bug's 500 is a result line too; a line that is
not a request gets its own error line, so none is dropped; a request the queue refuses is sent again; and the
command's bad input exits 2."""
from __future__ import annotations

import asyncio
import io
import json
import sys

import pytest

from specdecode.cli.main import main
from specdecode.core.target import Target
from specdecode.server.batch import BatchLines, index_lines, run_batch
from specdecode.server.protocol.batch_file import RESULT_START, FileBytes, begins_result, error_line, result_text
from tests.e2e.server_util import MODEL, serving, tiny_service
from tests.tiny import tool_tokenizer

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12, "temperature": 0}
BODIES = [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", {"model": MODEL, "prompt": "a b c a b c a b", "max_tokens": 16, "temperature": 0}),
    ("/v1/responses", {"model": MODEL, "input": "Hello there", "max_output_tokens": 6, "temperature": 0}),
    ("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5,
                      "temperature": 0}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 3, "n": 2, "temperature": 0.8, "seed": 7}),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2, "temperature": 0}),
]


@pytest.fixture(scope="module")
def target(tiny_model) -> Target:
    return Target(tiny_model, tool_tokenizer())


def _lines(bodies, prefix: str = "r") -> list[str]:
    return [json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": url, "body": body})
            for i, (url, body) in enumerate(bodies)]


def read_requests(lines: list[str]) -> BatchLines:
    return read_requests_bytes("\n".join(lines).encode())


def read_requests_bytes(data: bytes) -> BatchLines:
    return index_lines(io.BytesIO(data), data)


def _run(service, requests: BatchLines, concurrency: int, ahead: int | None = None) -> list[dict]:
    async def collect() -> list[dict]:
        return [line async for line in run_batch(service, requests, concurrency, ahead=ahead)]
    return asyncio.run(collect())


def _comparable(body: dict) -> dict:
    """An answer without what differs between two answers to one request (ids, times)."""
    drop = {"id", "created", "created_at"}
    if "choices" in body:
        return {**{k: v for k, v in body.items() if k not in drop}, "choices": body["choices"]}
    if body.get("object") == "response":
        return {"text": [item.get("content") for item in body["output"]], "usage": body["usage"]}
    return {k: v for k, v in body.items() if k not in drop}


def test_each_result_is_the_servers_answer_in_the_inputs_order(target):
    with serving(tiny_service(target)) as running:
        import httpx
        expected = [httpx.post(running.url + url, json=body, timeout=60).json() for url, body in BODIES]
    results = _run(tiny_service(target, max_batch=4), read_requests(_lines(BODIES)), concurrency=4)
    assert [line["custom_id"] for line in results] == [f"r{i}" for i in range(len(BODIES))]
    for line, answer in zip(results, expected):
        assert line["error"] is None and line["response"]["status_code"] == 200, line
        assert _comparable(line["response"]["body"]) == _comparable(answer)
        assert line["id"].startswith("batch_req_") and line["response"]["request_id"].startswith("req_")


def test_a_refused_request_keeps_its_error_and_a_line_that_is_no_request_gets_its_own(target):
    lines = [*_lines([("/v1/chat/completions", {**CHAT, "max_tokens": -1})], prefix="refused"),
             "not json", "[1]", json.dumps({"method": "POST", "url": "/v1/completions", "body": {}}),
             json.dumps({"custom_id": "get", "method": "GET", "url": "/v1/models", "body": {}}),
             json.dumps({"custom_id": "emb", "method": "POST", "url": "/v1/embeddings", "body": {}}),
             json.dumps({"custom_id": "nobody", "method": "POST", "url": "/v1/completions", "body": "x"}),
             json.dumps({"custom_id": "stream", "method": "POST", "url": "/v1/completions",
                         "body": {"model": MODEL, "prompt": "x", "stream": True}}),
             "", *_lines([("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})]),
             *_lines([("/v1/completions", {"model": MODEL, "prompt": "y", "max_tokens": 2})])]  # r0 again
    requests = read_requests(lines)
    assert len(requests) == len(lines) - 1  # the blank line only is skipped
    results = _run(tiny_service(target), requests, concurrency=2)
    refused, *unread, answered, again = results
    assert refused["response"]["status_code"] == 400
    assert refused["response"]["body"]["error"]["param"] == "max_tokens"
    errors = [line["error"]["message"] for line in unread]
    assert [line["response"] for line in unread] == [None] * 7
    for message, part in zip(errors, ["line 2 is not JSON", "line 3 is not a JSON object", "line 4 has no custom_id",
                                      "line 5: method must be", "line 6: url must be one of",
                                      "line 7: body must be a JSON object", "line 8: body.stream is not supported"]):
        assert message.startswith(part) and "\n" not in message
    assert answered["response"]["status_code"] == 200 and answered["custom_id"] == "r0"
    assert again["response"] is None and "used by an earlier line" in again["error"]["message"]


def test_a_request_the_queue_refuses_is_sent_again(target):
    """One row and a queue of one: the requests beyond those two are answered 429 and sent again."""
    bodies = [("/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": 4, "temperature": 0})
              for p in ("a", "b", "c", "d")]
    results = _run(tiny_service(target, max_batch=1, max_queue=1), read_requests(_lines(bodies)), concurrency=4)
    assert [line["response"]["status_code"] for line in results] == [200] * 4


def test_the_command_writes_a_line_per_request_and_bad_input_exits_2(tiny_model_dir, tmp_path, capsys):
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join([*_lines([("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})]),
                                 "{"]) + "\n")
    assert main(["batch", "--model", tiny_model_dir, "--served-model-name", "m", "-i", str(source),
                 "-o", str(out)]) == 0
    first, second = (json.loads(text) for text in out.read_text().splitlines())
    assert first["response"]["status_code"] == 200 and second["error"]["code"] == "invalid_request"
    assert "2 requests, 1 answered 200, 1 failed" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "nothing.jsonl").write_bytes(b"")
    first = source.read_bytes().split(b"\n")[0] + b"\n"
    (tmp_path / "latin1.jsonl").write_bytes(first + b'{"custom_id": "caf\xe9"}\n')
    for argv, message in ((["-i", str(tmp_path / "none.jsonl"), "-o", str(out)], "is not a file"),
                          (["-i", str(tmp_path / "empty.jsonl"), "-o", str(out)], "holds no requests"),
                          (["-i", str(tmp_path / "nothing.jsonl"), "-o", str(out)], "holds no requests"),
                          (["-i", str(tmp_path / "latin1.jsonl"), "-o", str(out)],
                           f"is not UTF-8 text (invalid continuation byte at byte {len(first) + 18})"),
                          (["-i", str(source), "-o", str(source)], "is the --input file"),
                          (["-i", str(source), "-o", str(tmp_path / "no" / "out.jsonl")], "folder does not exist"),
                          (["-i", str(source), "-o", str(tmp_path)], "is a folder"),  # was a traceback
                          (["-i", str(source), "-o", "/dev/full"], "writing failed (No space left on device)")):
        assert main(["batch", "--model", tiny_model_dir, "--served-model-name", "m", *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err


def test_resume_keeps_the_results_written_and_answers_the_rest(tiny_model_dir, tmp_path, capsys):
    """A run that stopped part way (its last line half written) goes on from its first unanswered request: the
    results already written stay as they are, the half line is cut off, and the file ends with one result per
    request in the input's order. An output that is not this input's head, or stdout, exits 2."""
    bodies = [("/v1/completions", {"model": "m", "prompt": f"x {i}", "max_tokens": 2}) for i in range(4)]
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join([*_lines(bodies), "{"]) + "\n")  # 5 lines, the last no request
    argv = ["batch", "--model", tiny_model_dir, "--served-model-name", "m", "-i", str(source), "-o", str(out)]
    assert main(argv) == 0
    whole = out.read_text().splitlines(keepends=True)
    out.write_text(whole[0] + whole[1][:20])  # stopped while writing the second result
    capsys.readouterr()
    assert main([*argv, "--resume"]) == 0
    resumed = out.read_text().splitlines(keepends=True)
    assert resumed[0] == whole[0] and len(resumed) == 5 and resumed[1] != whole[1]  # kept, then answered anew
    results = [json.loads(text) for text in resumed]
    assert [r["custom_id"] for r in results] == ["r0", "r1", "r2", "r3", None]
    assert [r["response"]["status_code"] for r in results[:4]] == [200] * 4 and results[4]["error"]
    assert "5 requests, 1 already in" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 0 and out.read_text() == "".join(resumed)  # nothing left: unchanged
    assert "5 already in" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(_lines(bodies, prefix="s")) + "\n")
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(_lines(bodies[:3])) + "\n")
    for extra, message in ((["-i", str(other), "--resume"], "its line 1 is the result of custom_id 'r0', where the "
                                                             "input's request 1 is 's0'"),
                           (["-i", str(fewer), "--resume"], "it holds 5 results, more than the 3 requests"),
                           (["-o", "-", "--resume"], "--resume needs --output to be a file")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err
    assert out.read_text() == "".join(resumed)  # a refused resume leaves the output as it was


def test_resume_cuts_only_a_last_line_that_begins_as_a_result(tiny_model_dir, tmp_path, capsys):
    """--resume cut any last line with no newline as half written: a file of other bytes with no newline was
    replaced. Only a start of a result line (or a start of that start) is cut; anything else exits 2, file kept."""
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(_lines([("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})])))
    argv = ["batch", "--model", tiny_model_dir, "--served-model-name", "m", "-i", str(source), "-o", str(out),
            "--resume"]
    for kept in (b"PRECIOUS user data", b'{"custom_id": "r0"}'):
        out.write_bytes(kept)
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "its line 1 ends with no newline and does not begin as a result line" in err and "\n" not in err
        assert out.read_bytes() == kept
    assert begins_result(b'{"id":"batch_req_12') and begins_result(b'{"i') and not begins_result(b"PRECIOUS")
    assert result_text(error_line("r0", "x", "y")).encode().startswith(RESULT_START)


def test_a_closed_stdout_ends_the_batch_quietly(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """`-o -` whose reader went away was "writing failed (Broken pipe)", a usage error (2): it is the quiet stop of
    any command whose stdout closed (cli/main.py, 141)."""
    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(_lines([("/v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2})])))
    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["batch", "--model", tiny_model_dir, "--served-model-name", "m", "-i", str(source), "-o", "-"]) == 141
    assert capsys.readouterr().err == ""


def test_a_slow_request_holds_a_bounded_window_of_results_behind_it(target, monkeypatch):
    """Every line's task was started at once, and a slow first request kept every later result in memory: at most
    `ahead` lines past the next one to write are read and started."""
    import specdecode.server.batch as batch_module
    seen = {"started": 0, "written": 0, "most": 0}

    async def slow_first(client, gate, request):
        seen["started"] += 1
        seen["most"] = max(seen["most"], seen["started"] - seen["written"])
        await asyncio.sleep(0.2 if request.line == 1 else 0)
        return {"custom_id": request.custom_id}
    monkeypatch.setattr(batch_module, "answer", slow_first)
    lines = read_requests(_lines([("/v1/completions", {"model": MODEL, "prompt": "x"})] * 40))

    async def collect() -> list[str]:
        written = []
        async for line in run_batch(tiny_service(target), lines, concurrency=4, ahead=6):
            seen["written"] += 1
            written.append(line["custom_id"])
        return written
    assert asyncio.run(collect()) == [f"r{i}" for i in range(40)]
    assert seen["most"] == 6


def test_a_line_of_an_input_cut_short_while_it_runs_is_no_request(tmp_path):
    """The offline batch reads each line from the file again when it sends it: a file cut short meanwhile gives that
    line an error (a map of the file would have been a crash: SIGBUS)."""
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(_lines(BODIES[:3])) + "\n")
    with open(path, "rb") as handle:
        lines = index_lines(handle, FileBytes(handle.fileno()))
        with open(path, "r+b") as cut:
            cut.truncate(path.stat().st_size - 20)
        assert lines.request(0).error is None and lines.request(0).custom_id == "r0"
        assert lines.request(2).error.startswith("line 3 is not JSON")


def test_a_byte_order_mark_that_begins_the_file_is_no_part_of_line_1(tmp_path):
    """A file saved with a UTF-8 BOM (Windows editors) had line 1 fail as "Unexpected UTF-8 BOM" while the rest ran:
    the mark is read as utf-8-sig reads it, and only at the file's start."""
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "\n".join(_lines(BODIES[:2])).encode() + b"\n")
    with open(path, "rb") as handle:
        lines = index_lines(handle, FileBytes(handle.fileno()))
        assert [(lines.request(i).custom_id, lines.request(i).error) for i in range(2)] == [("r0", None), ("r1", None)]
    later = ("\n".join(_lines(BODIES[:2])) + "\n").replace("\n", "\n\ufeff", 1).encode()
    assert read_requests_bytes(later).request(1).error.startswith("line 2 is not JSON")


def test_a_bug_is_a_500_result_line_and_the_batch_goes_on(target, monkeypatch):
    import specdecode.server.app as app_module

    async def broken(service, request):
        raise RuntimeError("a bug")
    monkeypatch.setattr(app_module, "_respond", broken)
    bodies = [("/v1/responses", {"model": MODEL, "input": "x"}),
              ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2})]
    results = _run(tiny_service(target), read_requests(_lines(bodies)), concurrency=2)
    assert [line["response"]["status_code"] for line in results] == [500, 200]
    assert "a bug" not in json.dumps(results[0])  # the server's 500 keeps its text to the log
