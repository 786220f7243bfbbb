"""bench-serve's client: a conversation sends each turn after the earlier turns and the server's own answers, and
each level sends the conversations after the previous level's (a fake OpenAI server on 127.0.0.1)."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdecode.bench.serve_client import bench, conversation, level_conversations, markdown


class _FakeServer(BaseHTTPRequestHandler):
    """Answers a chat request with the stream "echo: <last user turn>" in two chunks and a usage chunk (10 prompt
    tokens, 4 of them cached), and records the request."""

    seen: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(body)
        last = body["messages"][-1]["content"]
        chunks = [{"choices": [{"delta": {"content": "echo: "}}]}, {"choices": [{"delta": {"content": last}}]},
                  {"choices": [], "usage": {"completion_tokens": 3, "tau": 1.5, "prompt_tokens": 10,
                                            "prompt_tokens_details": {"cached_tokens": 4}}}]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_url():
    _FakeServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_conversation_sends_the_history_with_the_servers_answers(fake_url):
    samples = conversation(fake_url, "m", ["first", "second", "third"], 8, speculation=False)
    assert [(s.tokens, s.tau, s.prompt_tokens, s.cached_tokens) for s in samples] == [(3, 1.5, 10, 4)] * 3
    assert [body["messages"] for body in _FakeServer.seen] == [
        [{"role": "user", "content": "first"}],
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "echo: first"},
         {"role": "user", "content": "second"}],
        [{"role": "user", "content": "first"}, {"role": "assistant", "content": "echo: first"},
         {"role": "user", "content": "second"}, {"role": "assistant", "content": "echo: second"},
         {"role": "user", "content": "third"}],
    ]
    assert all(body["speculation"] == {"drafter": "none"} and body["max_tokens"] == 8 for body in _FakeServer.seen)


def test_each_level_sends_the_next_conversations(fake_url):
    conversations = [("a",), ("b", "b2"), ("c",)]
    assert level_conversations(conversations, 2, 3) == [("c",), ("a",), ("b", "b2")]
    levels = bench(fake_url, "m", conversations, [1, 2], requests=2, max_tokens=4, salted=True)
    assert [(level.concurrency, level.speculation, len(level.samples)) for level in levels] == [
        (1, True, 3), (1, False, 3), (2, False, 2), (2, True, 2)]  # a sample per turn
    assert all(level.cached_share == 0.4 for level in levels)
    assert all(row.endswith("| 40% |") for row in markdown(levels).splitlines()[2:])
    firsts = [body["messages"][0]["content"] for body in _FakeServer.seen[1:] if len(body["messages"]) == 1]
    # after the warm-up: level 1 (one client, on then off) a, b twice; level 2 (two clients, off then on) c and a
    assert firsts[:4] == ["a", "b", "a", "b"] and sorted(firsts[4:6]) == sorted(firsts[6:]) == ["a", "c"]
    salts = [body.get("cache_salt") for body in _FakeServer.seen]  # the warm-up, then each level and mode its own
    assert salts == [None] + ["level0"] * 3 + ["level1"] * 3 + ["level2"] * 2 + ["level3"] * 2
