"""Connections an idle or slow client cannot exhaust: uvicorn's h11 protocol with a deadline for every request
head, a bound on its size, a cap on open connections that closes the oldest idle one to make room (a client's
own first), and OpenAI-shaped JSON for the errors answered below the app.

Why a protocol class of our own: uvicorn holds a connection that never sends a byte for as long as the client
keeps it open (its keep-alive timeout starts only after a response, and any byte cancels it), and its
`limit_concurrency` answers every request, /health included, with a plain-text 503 once that many connections
are open: 512 idle sockets locked every client out. h11 bounds only a head that arrives in pieces, so a whole
60 KB head was read. Hypercorn has a read timeout but no cap that spares working connections; a subclass of the
pinned uvicorn's H11Protocol keeps the server we test everything else on (tests/e2e/test_server_connections.py
runs it on a real socket)."""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

from uvicorn.protocols.http.h11_impl import H11Protocol

from specdecode.errors import ConfigError

# after an answer written here, the client's further bytes are read and dropped for at most this long before the
# connection closes (lingering close, as nginx's lingering_close): closing with its bytes unread would reset the
# connection, and a reset can discard the answer before the client reads it
LINGER_S = 2.0
STATUS_TEXT = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too Large",
               503: "Service Unavailable"}


@dataclass(frozen=True)
class ConnectionLimits:
    """max_connections: connections open at once; a new one beyond it closes the oldest idle one (no request in
    flight), that client's first, and is answered 503 only when every open connection is working (/health is
    answered even then). per_client: connections one client address may hold; its oldest idle one makes room the
    same way. head_timeout_s: a request head must arrive whole within this many seconds of the connection opening
    or of the previous response (a client sending a byte at a time gains nothing). max_head_bytes: the largest
    request head (request line and headers); a larger one is answered 431."""

    max_connections: int = 512
    per_client: int = 64
    head_timeout_s: float = 10.0
    max_head_bytes: int = 16 << 10

    def __post_init__(self) -> None:
        for name, value in (("max_connections", self.max_connections), ("per_client", self.per_client),
                            ("max_head_bytes", self.max_head_bytes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if not 0 < self.head_timeout_s < float("inf"):
            raise ConfigError(f"head_timeout_s must be a positive number of seconds, got {self.head_timeout_s!r}")


def error_body(status: int, message: str) -> bytes:
    """An OpenAI-shaped error body (server/protocol/errors.py's shape, for answers written below the app)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()


def guarded_protocol(limits: ConnectionLimits, on_reject: Callable[[int], None] | None = None) -> type[H11Protocol]:
    """uvicorn's `http=` protocol class enforcing `limits`; on_reject(status) counts each answer it writes itself
    (the server's /metrics)."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits, "on_reject": staticmethod(
        on_reject or (lambda status: None))})


class GuardedH11Protocol(H11Protocol):
    """One connection. Between requests it waits for a head under a deadline (`_arm`); while a request is in
    flight it is working and is never closed to make room."""

    limits: ConnectionLimits = ConnectionLimits()
    on_reject: Callable[[int], None] = staticmethod(lambda status: None)

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        self._head_bytes = 0  # bytes of the head being received (0 between requests)
        self._tail = b""  # the last bytes of a head still arriving (its blank line may straddle two reads)
        self._deadline = None
        self._lingering = False  # answered here: what the client still sends is dropped until the close
        self._arm()
        self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        if self._waiting_for_head():
            end = _head_end(self._tail + data)  # the blank line may straddle two reads
            head = len(data) if end < 0 else max(0, end - len(self._tail))
            self._head_bytes += head
            if self._head_bytes > self.limits.max_head_bytes:
                self._answer(431, f"the request head is larger than {self.limits.max_head_bytes} bytes")
                return
            if end >= 0:
                self._head_bytes, self._tail = 0, b""
                self._disarm()
            else:
                self._tail = (self._tail + data)[-3:]
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next head has the same deadline as the first

    def send_400_response(self, msg: str) -> None:
        """h11 could not parse the request (uvicorn's answer is plain text): the same answer as JSON."""
        self._answer(400, msg)

    # -- the deadline and the cap ---------------------------------------------------------------------------------
    def _waiting_for_head(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.limits.head_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        """No whole head in time: a client that sent part of one gets a 408, a silent one is just closed."""
        self._deadline = None
        if not self._waiting_for_head() or self.transport.is_closing():
            return
        if self._head_bytes:
            self._answer(408, f"the request head did not arrive within {self.limits.head_timeout_s:g} s")
        else:
            self.transport.close()

    def _make_room(self) -> None:
        """Over a cap, close the oldest idle connection: this client's own over its cap, any client's over the
        total. When none is idle the server is busy with real work: this connection is answered 503 (its
        /health still gets through)."""
        everyone = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c is not self
                    and not c.transport.is_closing()]
        mine = [c for c in everyone if c.client and self.client and c.client[0] == self.client[0]]
        for group, cap in ((mine, self.limits.per_client), (everyone, self.limits.max_connections)):
            if len(group) + 1 <= cap:
                continue
            idle = sorted((c for c in group if c._waiting_for_head()), key=lambda c: c._opened)
            for victim in idle[: len(group) + 1 - cap]:
                victim._disarm()
                victim.transport.close()
                everyone = [c for c in everyone if c is not victim]
                mine = [c for c in mine if c is not victim]
            if len(idle) < len(group) + 1 - cap:
                self.app = _busy(self.app)
                return

    def _answer(self, status: int, message: str) -> None:
        """Write a JSON error and close. Written as bytes, not through h11: it answers a head h11 has not parsed
        (too slow, too large, or malformed), and the connection closes right after."""
        self._disarm()
        self.on_reject(status)
        body = error_body(status, message)
        head = (f"HTTP/1.1 {status} {STATUS_TEXT.get(status, 'Error')}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self._linger()

    def _linger(self) -> None:
        """Close once the client has stopped sending, or after LINGER_S: the answer is followed by the end of
        what this side sends (the client's read ends there), and the client's further bytes are dropped."""
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def _head_end(data: bytes) -> int:
    """Where a request head ends in `data` (just past its blank line; h11 takes a bare LF too), or -1."""
    ends = [found + len(mark) for mark in (b"\r\n\r\n", b"\n\n") if (found := data.find(mark)) >= 0]
    return min(ends, default=-1)


def _busy(app):
    """The app for a connection beyond the cap while every other one works: /health as usual, anything else a
    JSON 503 with Retry-After."""
    async def busy(scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("path") == "/health":
            await app(scope, receive, send)
            return
        body = error_body(503, "the server has no connection free for this request; retry later")
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return busy


def uvicorn_options(limits: ConnectionLimits, on_reject: Callable[[int], None] | None = None) -> dict:
    """uvicorn.Config keyword arguments that serve through GuardedH11Protocol: h11 (httptools has no bound on a
    buffered head; uvicorn would pick it wherever it is installed, and Ray brings it), no `limit_concurrency`
    (the protocol's cap replaces its plain-text 503), h11's buffer bounded like a whole head."""
    return {"http": guarded_protocol(limits, on_reject), "limit_concurrency": None,
            "h11_max_incomplete_event_size": limits.max_head_bytes}
