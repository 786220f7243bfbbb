"""The playground: `GET /` serves one static page (static/: HTML, CSS and plain JavaScript, shipped as package data,
no build step, nothing fetched from elsewhere) that talks only to this server's own API.

The page itself is public, like /health: it holds nothing of the server's. Its calls to /v1/* carry the API key
the user types (as `Authorization: Bearer`), so a server with `--api-key` still answers them only with the key.
Each request asks for `speculation.trace` and colours the answer's tokens by their origin (replies.py, Reply.traced).
"""
from __future__ import annotations

from importlib import resources

from fastapi import FastAPI
from fastapi.responses import Response

# path -> (file in static/, content type)
ASSETS = {"/": ("index.html", "text/html; charset=utf-8"),
          "/static/playground.js": ("playground.js", "text/javascript; charset=utf-8"),
          "/static/playground.css": ("playground.css", "text/css; charset=utf-8")}
# the page runs only its own script and style and talks only to this origin; no other site may frame it
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
          "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": POLICY, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
           "Referrer-Policy": "no-referrer"}


def add_playground(app: FastAPI) -> None:
    """Routes for the page and its two files, read once here (a missing file fails at start-up, not per request)."""
    folder = resources.files("specdecode.server") / "static"
    for path, (name, media_type) in ASSETS.items():
        body = (folder / name).read_bytes()
        app.add_api_route(path, _responder(body, media_type), methods=["GET"], include_in_schema=False)


def _responder(body: bytes, media_type: str):
    async def asset() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return asset
