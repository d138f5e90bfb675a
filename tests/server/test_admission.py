"""Admission over real sockets: a streamed request's headers come once it is scheduled (not while
it queues), a request queued past the admission timeout gets 503 + Retry-After, and /metrics
counts the queue (length, and the time of requests that never left it)."""

from __future__ import annotations

import json
import re
import select
import socket
from urllib.parse import urlparse

import httpx
import pytest

from server.cli import add_serve_arguments, in_flight_limit
from tests.server.fake_engine import FakeEngine
from tests.server.harness import wait_until

COMPLETIONS = "/v1/completions"
LONG = {"prompt": "x", "max_tokens": 400, "ignore_eos": True, "stream": True}  # >= 8 s
WAIT_S = 30


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=WAIT_S).text
    match = re.search(rf"^goodspeed:{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not in /metrics"
    return float(match.group(1))


def one_running(start_server, **settings):
    """A server running one sequence at a time, and a long stream holding it."""
    server = start_server(FakeEngine(step_delay=0.02, max_num_seqs=1), **settings)
    return (server, *long_stream(server))


def long_stream(server):
    client = httpx.Client(base_url=server.url, timeout=WAIT_S)
    first = client.send(client.build_request("POST", COMPLETIONS, json=LONG), stream=True)
    assert first.status_code == 200
    lines = first.iter_lines()  # kept: a dropped iterator would close the stream
    assert next(line for line in lines if line.startswith("data: {"))
    return client, first, lines


def raw_stream_request(url: str) -> socket.socket:
    parsed = urlparse(url)
    body = json.dumps({"prompt": "y", "max_tokens": 3, "stream": True}).encode()
    head = (
        f"POST {COMPLETIONS} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=WAIT_S)
    sock.sendall(head + body)
    return sock


def nothing_received(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return not readable


def test_streamed_headers_are_sent_once_the_request_is_scheduled(start_server):
    server, client, first, _ = one_running(start_server, admission_timeout_s=WAIT_S)
    with raw_stream_request(server.url) as sock:
        assert wait_until(lambda: metric(server, "num_requests_waiting") == 1, timeout=WAIT_S)
        assert nothing_received(sock)  # queued: no status line, no headers yet
        first.close()  # the running stream goes away: the queued one is scheduled
        response = b""
        while chunk := sock.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 200")
    assert b"data: [DONE]" in response and b'"finish_reason":"length"' in response
    client.close()


@pytest.mark.parametrize("stream", [False, True])
def test_admission_ends_when_the_request_is_scheduled_not_at_the_next_poll(start_server, stream):
    # The admission wait also watches for a drain; it once waited for both (asyncio.wait's
    # default), so every request sat out a whole poll. With a poll and an admission timeout
    # longer than the client's patience, that would now time the client out.
    engine = FakeEngine(step_delay=0.05)
    server = start_server(engine, disconnect_poll_s=4 * WAIT_S, admission_timeout_s=4 * WAIT_S)
    body = {"prompt": "x", "max_tokens": 2, "stream": stream}
    for _ in range(2):
        response = httpx.post(server.url + COMPLETIONS, json=body, timeout=WAIT_S)
        assert response.status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_queued_past_the_admission_timeout_is_503_and_counted(start_server, stream):
    server, client, first, lines = one_running(start_server, admission_timeout_s=0.3)
    body = {"prompt": "y", "max_tokens": 3, "stream": stream}
    refused = client.post(COMPLETIONS, json=body)
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    error = refused.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "not scheduled within 0.3 s" in error["message"]
    # Its queue time is in the histogram though it never ran; it left the queue.
    assert wait_until(lambda: metric(server, "request_queue_time_seconds_count") >= 1, WAIT_S)
    assert metric(server, "request_queue_time_seconds_sum") >= 0.3
    assert wait_until(lambda: metric(server, "num_requests_waiting") == 0, timeout=WAIT_S)
    # The running stream is untouched.
    payloads = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    client.close()


def test_a_queued_client_hanging_up_frees_its_place(start_server):
    engine = FakeEngine(step_delay=0.02, max_num_seqs=1)
    server = start_server(engine, max_num_in_flight=2, admission_timeout_s=WAIT_S)
    client, first, _ = long_stream(server)
    with raw_stream_request(server.url):
        assert wait_until(lambda: metric(server, "num_requests_waiting") == 1, timeout=WAIT_S)
    # Gone while queued: aborted (its place in the in-flight limit freed) before it ever ran.
    assert wait_until(lambda: metric(server, "num_requests_waiting") == 0, timeout=WAIT_S)
    assert server.async_engine.num_in_flight == 1 and engine.num_aborted == 1
    with raw_stream_request(server.url):  # the freed place takes a new request
        assert wait_until(lambda: metric(server, "num_requests_waiting") == 1, timeout=WAIT_S)
    first.close()
    client.close()


def test_default_queue_is_one_batch_deep():
    import argparse

    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    args = parser.parse_args(["--model", "m"])
    assert args.max_queue is None and args.admission_timeout == 30.0
    assert in_flight_limit(8, args.max_queue) == 16
    assert in_flight_limit(8, 0) == 8
    assert in_flight_limit(8, parser.parse_args(["--max-queue", "unlimited"]).max_queue) is None
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-queue", "-3"])
