"""RequestStream: the asyncio side of one request, fed by AsyncEngine on the event loop.

A stream ends after the finished output of each of its n choices, or with an exception
(EngineDeadError when the engine thread died or the server shut down). `started` is set once
the engine first schedules the request (it left the queue), or once anything reaches the
stream (an output, or an error ending it before it was ever scheduled).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from engine.outputs import RequestOutput


class EngineDeadError(RuntimeError):
    """The engine thread stopped (crash or shutdown); no request can make progress."""


class QueueFullError(RuntimeError):
    """Admission refused: too many sequences in flight (the server answers 503 + Retry-After)."""


_END = object()  # queued after a stream's last output


class RequestStream:
    """Async iterable over one request's outputs (all n choices), ending after the last one.

    `close()` aborts the request if it has not finished; call it when the consumer goes away
    (a stream that saw its last output, or an error, has nothing left to abort: the engine
    side forgot it then).
    """

    def __init__(self, request_id: str, num_choices: int, on_close: Callable[[str], None]) -> None:
        self.request_id = request_id
        self.num_choices = num_choices
        self._num_unfinished = num_choices
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._on_close = on_close
        self._closed = False
        self.started = asyncio.Event()

    @property
    def finished(self) -> bool:
        return self._num_unfinished == 0

    def put(self, item: RequestOutput | BaseException) -> None:
        """Called on the event loop by AsyncEngine; an exception ends the stream with it."""
        self.started.set()
        self._queue.put_nowait(item)
        if isinstance(item, RequestOutput) and item.finished:
            self._num_unfinished -= 1
            if self._num_unfinished == 0:
                self._queue.put_nowait(_END)
        elif isinstance(item, BaseException):
            self._num_unfinished = 0
            self._queue.put_nowait(_END)

    async def __aiter__(self) -> AsyncIterator[RequestOutput]:
        while (item := await self._queue.get()) is not _END:
            if isinstance(item, BaseException):
                raise item
            yield item
        self._queue.put_nowait(_END)  # later iterations end too

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if not self.finished:
                self._on_close(self.request_id)
