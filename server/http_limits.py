"""Connection limits uvicorn lacks: a deadline for a request's headers.

uvicorn closes an idle keep-alive connection after `timeout_keep_alive`, but a connection that
sends its headers a byte at a time (or opens and sends part of a request line) is held forever.
`header_timeout_protocol(seconds)` is uvicorn's h11 protocol with one timer more: armed when a
connection opens, and again when the first byte of a later request on it arrives; cancelled
once h11 has the whole request head. If it fires first, the connection is closed (nothing is
sent: there is no request to answer). The body's deadline and size limit are the app's
(server/middleware.py), where a 408 or 413 can be answered in OpenAI's error shape.

`uvicorn_config` builds the config `goodspeed serve` and the test harness share.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class _HeaderTimeoutH11(H11Protocol):
    header_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # a request head is (still) on its way
            self._arm_header_timer()
        else:
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info(
                "closing a connection whose request head took over %ss", self.header_timeout_s
            )
            self.transport.close()


def header_timeout_protocol(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol closing connections whose request head takes over `seconds`."""
    if seconds <= 0:
        raise ValueError(f"the header timeout must be > 0 seconds, got {seconds}")
    return type("HeaderTimeoutH11", (_HeaderTimeoutH11,), {"header_timeout_s": seconds})


def uvicorn_config(
    app: Any, host: str, port: int, header_timeout_s: float, **kwargs: Any
) -> uvicorn.Config:
    return uvicorn.Config(
        app, host=host, port=port, http=header_timeout_protocol(header_timeout_s), **kwargs
    )
