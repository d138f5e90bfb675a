"""Fixtures: servers on the fake engine (see harness.py), stopped when the test/module ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.harness import RunningServer, run_server


@pytest.fixture
def start_server() -> Iterator[Callable[..., RunningServer]]:
    servers: list[RunningServer] = []

    def start(engine: Any = None, **kwargs: Any) -> RunningServer:
        server = run_server(engine if engine is not None else FakeEngine(), **kwargs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def fake_server() -> Iterator[RunningServer]:
    """One shared server on a fast fake engine for a whole test module."""
    server = run_server(FakeEngine())
    yield server
    server.stop()
