"""Checks that run before any route: draining (503), API key (401), body size (413).

A pure ASGI middleware (no BaseHTTPMiddleware) so that streaming responses and disconnect
detection pass through untouched. The body is read here, up to the limit, whether or not the
client sent Content-Length (chunked uploads are counted while reading), then replayed to the app.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import error_bytes

# Open without an API key and while draining: probes and scrapers must keep working.
OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})
DRAIN_FACTOR = 16


class GuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        api_key: str | None,
        is_draining: Callable[[], bool],
        retry_after_s: int = 1,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key
        self.is_draining = is_draining
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.is_draining():
            retry = [(b"retry-after", str(self.retry_after_s).encode())]
            await _send_error(send, 503, "the server is shutting down", extra_headers=retry)
            return
        if self.api_key is not None and not self._authorized(scope):
            auth = [(b"www-authenticate", b"Bearer")]
            await _send_error(send, 401, "missing or invalid API key", "invalid_api_key", auth)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        expected = self.api_key or ""
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), expected)

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None after answering 413 (too large) or on disconnect.

        An oversized body is still read (and dropped) up to DRAIN_FACTOR times the limit: most
        clients send the whole body before reading the answer, and would otherwise see a reset
        connection instead of the 413.
        """
        limit = self.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length", b"")
        too_large = declared.isdigit() and int(declared) > limit
        if too_large and int(declared) > DRAIN_FACTOR * limit:
            await self._too_large(send)
            return None
        chunks: list[bytes] = []
        size = 0
        more = True
        while more and size <= DRAIN_FACTOR * limit:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            too_large = too_large or size > limit
            if not too_large:
                chunks.append(chunk)
            more = message.get("more_body", False)
        if too_large:
            await self._too_large(send)
            return None
        return b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        limit = self.max_body_bytes
        await _send_error(send, 413, f"request body exceeds the limit of {limit} bytes")


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive() that yields the buffered body once, then the client's later messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def _send_error(
    send: Send,
    status: int,
    message: str,
    code: str | None = None,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    body = error_bytes(status, message, code)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
