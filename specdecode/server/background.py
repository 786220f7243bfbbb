"""Run a uvicorn server in a background thread on 127.0.0.1 (tests and bench-serve): the OS picks a free port."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI

from specdecode.server.connections import ConnectionLimits, uvicorn_options


class BackgroundServer:
    """`with BackgroundServer(app) as server: httpx.get(server.url + "/health")`."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 limits: ConnectionLimits | None = None, on_reject: Callable[[int], None] | None = None, **options):
        """limits: the connection limits, as `specdecode serve` enforces them (server/connections.py), on_reject
        counting what they answer; options: further uvicorn.Config keyword arguments."""
        self.app = app
        guarded = uvicorn_options(limits or ConnectionLimits(), on_reject)
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                                                    timeout_graceful_shutdown=5, **{**guarded, **options}))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.host = host
        self.port = port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
