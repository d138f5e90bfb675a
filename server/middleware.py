"""The ASGI middlewares around every route, outermost first: the request id every response
carries (X-Request-Id); the answer to an unhandled exception (one log line and a 500 in
OpenAI's shape, so neither Starlette nor uvicorn logs it again and the keep-alive connection
survives); the checks before any route: draining (503), API key (401), body size (413). Each
refusal is logged once (server/errors.py's log_failure).

Pure ASGI middlewares (no BaseHTTPMiddleware), so that streaming responses and disconnect
detection pass through untouched. The guard reads the body, then replays it to the app:
- a declared Content-Length over the limit is answered 413 before any of the body is read;
  a chunked upload is counted while reading and answered 413 once it passes the limit;
- the whole body must arrive within `body_timeout_s`, else 408 (a client declaring 10 MiB and
  sending 100 bytes, or a chunked body never finished, would otherwise hold a task forever).
Both answers close the connection (`Connection: close`): the rest of the body is never read.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import re
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.errors import ERROR_TYPES, APIError, error_bytes, log_failure

logger = logging.getLogger(__name__)

# A client's X-Request-Id is kept when it is short printable ASCII; otherwise a new one is made.
_CLIENT_REQUEST_ID = re.compile(rb"[\x21-\x7e]{1,128}")
REQUEST_ID_HEADER = b"x-request-id"

# Open without an API key and while draining: probes and scrapers must keep working.
OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})
CLOSE = [(b"connection", b"close")]


class GuardMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        api_key: str | None,
        is_draining: Callable[[], bool],
        retry_after_s: int = 1,
        body_timeout_s: float = 30.0,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.api_key = api_key
        # Compared as bytes: hmac.compare_digest refuses non-ASCII str (a 500 before).
        self._api_key_bytes = api_key.encode() if api_key is not None else b""
        self.is_draining = is_draining
        self.retry_after_s = retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        if self.is_draining():
            retry = [(b"retry-after", str(self.retry_after_s).encode())]
            await _send_error(scope, send, 503, "the server is shutting down", extra_headers=retry)
            return
        if self.api_key is not None and not self._authorized(scope):
            auth = [(b"www-authenticate", b"Bearer")]
            message = "missing or invalid API key"
            await _send_error(scope, send, 401, message, "invalid_api_key", auth)
            return
        body = await self._read_body(scope, receive, send)
        if body is None:
            return
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(
            token.strip(), self._api_key_bytes
        )

    async def _read_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None after answering 413 (too large) or 408 (too slow), or on
        disconnect."""
        if _declared_size(scope) > self.max_body_bytes:
            await self._too_large(scope, send)
            return None
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await self._receive_body(scope, receive, send)
        except TimeoutError:
            message = f"the request body did not arrive within {self.body_timeout_s:g} s"
            await _send_error(scope, send, 408, message, extra_headers=CLOSE)
            return None

    async def _receive_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(scope, send)
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _too_large(self, scope: Scope, send: Send) -> None:
        message = f"request body exceeds the limit of {self.max_body_bytes} bytes"
        await _send_error(scope, send, 413, message, extra_headers=CLOSE)


def _declared_size(scope: Scope) -> int:
    """Content-Length as sent, -1 when absent or malformed. An absurdly long number counts as
    huge rather than reaching int() (which refuses more than 4300 digits)."""
    value = dict(scope["headers"]).get(b"content-length", b"")
    if not value.isdigit():
        return -1
    return int(value) if len(value) <= 18 else 10**18


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
    scope: Scope,
    send: Send,
    status: int,
    message: str,
    code: str | None = None,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    log_failure(scope, status, ERROR_TYPES[status], message)
    body = error_bytes(status, message, code)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *(extra_headers or []),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestIdMiddleware:
    """X-Request-Id: the client's (when usable) or a fresh one, kept in scope["state"] for the
    handlers and the failure log line, and echoed on every response. Outermost, so even a
    401, 413 or 500 carries it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(REQUEST_ID_HEADER, b"")
        request_id = given if _CLIENT_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex.encode()
        scope.setdefault("state", {})["request_id"] = request_id.decode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [h for h in message.get("headers", []) if h[0] != REQUEST_ID_HEADER]
                message = {**message, "headers": [*headers, (REQUEST_ID_HEADER, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)


class UnhandledErrorMiddleware:
    """Outermost: a bug anywhere below becomes one log line and a 500 in OpenAI's shape (or,
    once a response has begun, an ended response), never a re-raised exception."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log_failure(scope, 500, type(exc).__name__, str(exc)[:500])
            logger.debug("traceback of the failed request", exc_info=exc)
            if not started:
                error = APIError(500, f"internal error: {type(exc).__name__}")
                await error.response()(scope, receive, send)
            else:  # end the cut response cleanly rather than leave the client waiting
                await send({"type": "http.response.body", "body": b"", "more_body": False})
