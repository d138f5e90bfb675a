"""Test harness: a real uvicorn server on 127.0.0.1 (free port) in a background thread.

`run_server(engine, **settings)` returns a RunningServer with its base URL, the AsyncEngine
and the wrapped engine; `stop()` ends it.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from engine.front.async_engine import AsyncEngine
from server.app import build_app
from server.http_limits import uvicorn_config
from server.settings import ServerSettings


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    async_engine: AsyncEngine
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def engine(self) -> Any:
        return self.async_engine.engine

    @property
    def api(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def run_server(engine: Any, max_num_in_flight: int | None = None, **settings: Any) -> RunningServer:
    async_engine = AsyncEngine(engine, max_num_in_flight=max_num_in_flight)
    app = build_app(async_engine, ServerSettings(**settings))
    port = free_port()
    config = uvicorn_config(
        app, "127.0.0.1", port, app.state.ctx.settings.header_timeout_s, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("test server did not start")
        time.sleep(0.01)
    return RunningServer(f"http://127.0.0.1:{port}", async_engine, server, thread)


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()
