"""Slow and lying clients over raw sockets: a request head that never ends is cut off, a declared
body over the limit is refused before it is read, a body that never arrives gets 408."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlparse

import pytest

WAIT_S = 30  # generous: these answers come after ~0.5 s, even on a loaded machine


@pytest.fixture
def server(start_server):
    return start_server(header_timeout_s=0.5, body_timeout_s=0.5, max_body_bytes=16 * 2**20)


def connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=WAIT_S)
    return sock


def read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def head(content_length: int | None = None, chunked: bool = False) -> bytes:
    lines = ["POST /v1/completions HTTP/1.1", "Host: test", "Content-Type: application/json"]
    if content_length is not None:
        lines.append(f"Content-Length: {content_length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_and_error(response: bytes) -> tuple[int, dict]:
    header, _, body = response.partition(b"\r\n\r\n")
    status = int(header.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def test_unfinished_request_head_is_closed(server):
    with connect(server.url) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\n")  # no blank line
        assert read_all(sock) == b""  # closed by the server, nothing sent


def closed(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)  # (recv would wait: the socket has a timeout)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except ConnectionError:
        return True


def test_head_sent_a_byte_at_a_time_is_closed_before_it_ends(server):
    request = head(2).replace(b"Host: test", b"Host: test\r\nX-Pad: " + b"a" * 300) + b"{}"
    with connect(server.url) as sock:
        for byte in request:  # ~17 s in all at 50 ms a byte: 30x the header timeout
            if closed(sock):
                break
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the server waited for the whole slow request head")


def test_declared_body_over_the_limit_is_413_before_any_body(server):
    with connect(server.url) as sock:
        sock.sendall(head(content_length=26 * 2**20))  # 10 MiB over the 16 MiB limit, no body
        status, error = status_and_error(read_all(sock))
    assert status == 413 and "16777216" in error["message"]
    assert error["type"] == "invalid_request_error"


def test_declared_body_never_sent_is_408(server):
    with connect(server.url) as sock:
        sock.sendall(head(content_length=10 * 2**20) + b"x" * 100)  # 10 MiB declared, 100 sent
        status, error = status_and_error(read_all(sock))
    assert status == 408 and "did not arrive" in error["message"]


def test_chunked_body_never_finished_is_408(server):
    with connect(server.url) as sock:
        sock.sendall(head(chunked=True) + b'5\r\n{"pro\r\n')  # and no last chunk
        status, _ = status_and_error(read_all(sock))
    assert status == 408


def test_a_prompt_client_is_served_on_the_same_server(server):
    body = json.dumps({"prompt": "hi", "max_tokens": 2}).encode()
    with connect(server.url) as sock:
        sock.sendall(head(len(body)).replace(b"Host: test", b"Host: test\r\nConnection: close"))
        sock.sendall(body)
        response = read_all(sock)
    assert response.startswith(b"HTTP/1.1 200")
