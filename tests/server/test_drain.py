"""SIGTERM on a server subprocess: in-flight requests finish, new ones get 503, exit code 0."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.harness import free_port, wait_until

SCRIPT = Path(__file__).resolve().parent / "fake_server.py"


def start(drain_timeout: float, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--port", str(port), "--drain-timeout", str(drain_timeout)]
        + list(flags),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            return httpx.get(url + "/health", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    if not wait_until(healthy, timeout=30):
        process.kill()
        pytest.fail(f"server did not start: {process.communicate()[0].decode()[-2000:]}")
    return process, url


class StreamingClient(threading.Thread):
    """Streams one completion in the background; records the SSE payloads it got."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.started_streaming = threading.Event()
        self.payloads: list[dict] = []

    def run(self) -> None:
        body = {"prompt": "x", "max_tokens": self.max_tokens, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", self.url + "/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    self.payloads.append(json.loads(line[len("data: ") :]))
                    self.started_streaming.set()

    @property
    def text(self) -> str:
        return "".join(p["choices"][0]["text"] for p in self.payloads if "choices" in p)


def test_sigterm_drains_in_flight_requests_and_exits_zero():
    process, url = start(drain_timeout=20)
    clients = [StreamingClient(url, max_tokens=150) for _ in range(3)]  # >= 1.5 s each
    for client in clients:
        client.start()
    assert all(c.started_streaming.wait(10) for c in clients)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    refused = httpx.post(url + "/v1/completions", json={"prompt": "x"}, timeout=5)
    assert refused.status_code == 503 and refused.headers["retry-after"]
    assert httpx.get(url + "/health", timeout=5).status_code == 503
    for client in clients:
        client.join(20)
        assert len(client.text) == 150  # finished in full despite the SIGTERM
        assert client.payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert process.wait(20) == 0


def test_drain_timeout_aborts_what_is_left_and_still_exits_zero():
    process, url = start(drain_timeout=0.5)
    client = StreamingClient(url, max_tokens=400)  # ~4 s at 10 ms a token
    client.start()
    assert client.started_streaming.wait(10)
    process.send_signal(signal.SIGTERM)
    client.join(20)
    assert "shutting down" in client.payloads[-1]["error"]["message"]
    assert process.wait(20) == 0


def test_sigterm_refuses_queued_requests_and_finishes_the_running_one():
    """A queued request has no headers yet: on SIGTERM it gets 503 + Retry-After (a client can
    retry it elsewhere) instead of holding the drain; the running stream finishes in full."""
    process, url = start(20, "--max-num-seqs", "1")
    running = StreamingClient(url, max_tokens=400)  # >= 4 s
    running.start()
    assert running.started_streaming.wait(10)
    queued: list[httpx.Response] = []
    body = {"prompt": "y", "max_tokens": 3}
    waiter = threading.Thread(
        target=lambda: queued.append(httpx.post(url + "/v1/completions", json=body, timeout=30))
    )
    waiter.start()

    def num_waiting() -> float:
        text = httpx.get(url + "/metrics", timeout=5).text
        line = next(x for x in text.splitlines() if x.startswith("goodspeed:num_requests_waiting"))
        return float(line.rsplit(" ", 1)[1])

    assert wait_until(lambda: num_waiting() == 1, timeout=20)
    process.send_signal(signal.SIGTERM)
    waiter.join(20)
    assert queued[0].status_code == 503 and queued[0].headers["retry-after"]
    assert "shutting down" in queued[0].json()["error"]["message"]
    running.join(20)
    assert running.payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert process.wait(20) == 0
