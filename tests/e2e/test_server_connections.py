"""Connections an idle or slow client cannot exhaust (server/connections.py), on real servers on 127.0.0.1:
hundreds of idle sockets, a head sent a byte at a time, a head too large, a malformed one, and a server whose
every connection is working. Each answer below the app is OpenAI-shaped JSON and counted in /metrics."""
from __future__ import annotations

import asyncio
import json
import resource
import socket
import time

import httpx
import pytest
from fastapi import FastAPI

from specdecode.server.background import BackgroundServer
from specdecode.server.connections import ConnectionLimits
from tests.e2e.server_util import MODEL, serving, tiny_service

HEAD_TIMEOUT = 1.5


@pytest.fixture(scope="module")
def server(tiny_target):
    with serving(tiny_service(tiny_target), ConnectionLimits(head_timeout_s=HEAD_TIMEOUT)) as running:
        yield running


@pytest.fixture
def many_files():
    """Room for ~1,300 sockets in this process (the clients' and the server's ends)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, max(soft, 4096))
    if wanted < 1400:
        pytest.skip(f"needs ~1,400 file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _connect(server) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=10)


def _raw(server, data: bytes, chunk_wait: float | None = None) -> bytes:
    """Send `data` (a byte at a time, `chunk_wait` apart, when given) and read the answer until the server closes."""
    with _connect(server) as sock:
        if chunk_wait is None:
            sock.sendall(data)
        else:
            for byte in data:
                try:
                    sock.sendall(bytes([byte]))
                except OSError:  # closed by the server mid-head
                    break
                time.sleep(chunk_wait)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        return answer


def _json_error(answer: bytes, status: int) -> dict:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head[:80]
    assert b"content-type: application/json" in head.lower()
    return json.loads(body)["error"]


def _rejected(server, status: int) -> float:
    text = httpx.get(server.url + "/metrics").text
    line = f'specdecode_requests_total{{endpoint="connection",status="{status}"}}'
    return next((float(row.split()[-1]) for row in text.splitlines() if row.startswith(line)), 0.0)


def test_idle_sockets_do_not_lock_clients_out(server, many_files):
    """600 sockets that connect and send nothing (more than the 512 connections allowed, and ten times one client's
    share): /health answers within a second and a completion is served."""
    idle = [_connect(server) for _ in range(600)]
    try:
        began = time.monotonic()
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == 200 and time.monotonic() - began < 1.0
        reply = httpx.post(server.url + "/v1/completions", timeout=60,
                           json={"model": MODEL, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["choices"][0]["text"] is not None
    finally:
        for sock in idle:
            sock.close()


def test_a_silent_connection_is_closed_after_the_head_timeout(server):
    with _connect(server) as sock:
        sock.settimeout(HEAD_TIMEOUT * 4)
        began = time.monotonic()
        assert sock.recv(1) == b""  # closed without an answer: it asked nothing
        assert HEAD_TIMEOUT * 0.8 < time.monotonic() - began < HEAD_TIMEOUT * 3


def test_a_head_sent_a_byte_at_a_time_gets_408(server):
    """Each byte would restart uvicorn's keep-alive timer; the head's deadline counts from the connection."""
    before = _rejected(server, 408)
    began = time.monotonic()
    answer = _raw(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n",
                  chunk_wait=0.05)
    assert time.monotonic() - began < HEAD_TIMEOUT * 3
    assert "did not arrive" in _json_error(answer, 408)["message"]
    assert _rejected(server, 408) == before + 1


def test_a_head_over_16_kib_gets_431_even_in_one_piece(server):
    before = _rejected(server, 431)
    answer = _raw(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 60_000 + b"\r\n\r\n")
    assert "larger than 16384 bytes" in _json_error(answer, 431)["message"]
    assert _rejected(server, 431) == before + 1
    assert httpx.get(server.url + "/health").status_code == 200  # a head under the bound is served
    ok = _raw(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 15_000 +
              b"\r\nConnection: close\r\n\r\n")
    assert ok.startswith(b"HTTP/1.1 200 ")


def test_a_malformed_request_gets_json_400(server):
    before = _rejected(server, 400)
    error = _json_error(_raw(server, b"NOT HTTP AT ALL\r\n\r\n"), 400)
    assert error["type"] == "invalid_request_error"
    assert _rejected(server, 400) == before + 1


def test_working_connections_are_not_closed_and_health_still_answers():
    """With every connection working, one more gets a JSON 503 with Retry-After, /health still answers, and the
    working requests finish."""
    app = FastAPI()

    @app.get("/slow")
    async def slow() -> dict:
        await asyncio.sleep(1.5)
        return {"done": True}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    limits = ConnectionLimits(max_connections=3, head_timeout_s=5.0)
    with BackgroundServer(app, limits=limits) as running, httpx.Client(base_url=running.url, timeout=10) as _:
        workers = [_connect(running) for _ in range(3)]
        for sock in workers:
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        time.sleep(0.3)  # all three are working
        busy = _raw(running, b"GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert busy.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in busy.lower()
        assert "no connection free" in json.loads(busy.partition(b"\r\n\r\n")[2])["error"]["message"]
        health = _raw(running, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert health.startswith(b"HTTP/1.1 200 ")
        for sock in workers:
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            sock.close()
            assert answer.startswith(b"HTTP/1.1 200 ") and b'"done":true' in answer


def test_limits_are_checked():
    for bad in (dict(max_connections=0), dict(per_client=-1), dict(head_timeout_s=0), dict(max_head_bytes=True)):
        with pytest.raises(ValueError):
            ConnectionLimits(**bad)


def test_a_large_body_after_a_split_blank_line_is_not_counted_as_head(server):
    """The head's blank line split over two reads, then a 40 KB body: a request served, not a 431."""
    body = json.dumps({"model": MODEL, "prompt": "x" * 40_000, "max_tokens": 1}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n").encode()
    with _connect(server) as sock:
        sock.sendall(head)
        time.sleep(0.2)
        sock.sendall(b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert not answer.startswith(b"HTTP/1.1 431 "), answer[:200]
