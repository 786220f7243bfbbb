"""Reading a request body with bounds: a client cannot make the server hold more than `limit` bytes of it, or wait
on it longer than `timeout_s` (a slow sender holds no task). Shared by the API's JSON routes, the Files API's
uploads and the replicas' front end."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.requests import ClientDisconnect, Request

from specdecode.server.protocol.errors import APIError, shown

log = logging.getLogger(__name__)


async def read_body(request: Request, limit: int, timeout_s: float,
                    arrived: Callable[[int], None] | None = None) -> bytes:
    """The whole body, or a one-line error: 413 when too large, 408 when too slow, 499 when the client went away
    (logged as one line: a client hanging up is not a server fault). arrived(size), if given, is told the bytes
    read so far after each chunk (it may raise an APIError: the Files API's room for an undeclared upload)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_limited(request, limit, arrived)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout") from None
    except ClientDisconnect:
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.warning("%s disconnected before sending the whole request body to %s", client, request.url.path)
        raise APIError(499, "the client disconnected before sending the whole request body",
                       code="client_disconnected") from None


async def _read_limited(request: Request, limit: int, arrived: Callable[[int], None] | None) -> bytes:
    too_large = APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        if arrived is not None:
            arrived(size)
        chunks.append(chunk)
    return b"".join(chunks)


def require_json(request: Request) -> None:
    """Only JSON bodies: a browser sends text/plain, form or untyped bodies cross-origin without a CORS preflight,
    so parsing those as JSON would let any web page start generations here."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    subtype = media_type.removeprefix("application/")
    if subtype == media_type or not (subtype == "json" or subtype.endswith("+json")):
        got = f"got {shown(media_type)}" if media_type else "got no Content-Type"
        raise APIError(415, f"the request body must be JSON with Content-Type: application/json; {got}",
                       code="unsupported_media_type")
