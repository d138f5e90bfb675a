"""Server-sent events: `data: {json}\\n\\n` frames ending with `data: [DONE]\\n\\n`.

An error after the stream began can no longer change the HTTP status, so it is sent as one
`data: {"error": {...}}` event before [DONE]. SSEResponse runs its `on_close` however the
response ends (finished, failed, client gone), which is where unfinished requests get aborted.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from engine.front.async_engine import EngineDeadError, RequestStream
from engine.outputs import RequestOutput
from server.errors import ERROR_TYPES, APIError, bad_request, log_failure

logger = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_event(payload: BaseModel | dict[str, Any]) -> bytes:
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json()
    else:
        data = json.dumps(payload)
    return b"data: " + data.encode() + b"\n\n"


class ChunkTemplate:
    """The SSE event of a streamed chunk holding one plain choice (text only: no logprobs, no
    tool calls, no usage), built from pre-encoded bytes instead of pydantic models: the
    common per-token event, byte for byte what `sse_event(model)` gives
    (tests/server/test_sse.py compares them). `envelope` is the response model with no choices.
    """

    def __init__(self, envelope: BaseModel) -> None:
        empty = envelope.model_dump_json().encode()
        head, marker, tail = empty.partition(b'"choices":[]')
        if not marker:
            raise ValueError("the envelope must have an empty choices list")
        self._head = b"data: " + head + b'"choices":['
        self._tail = b"]" + tail + b"\n\n"

    def chat(self, index: int, content: str, finish_reason: str | None) -> bytes:
        choice = (
            b'{"index":%d,"delta":{"role":null,"content":%s},"logprobs":null,"finish_reason":%s}'
        )
        return self._event(choice % (index, _text(content), _text(finish_reason)))

    def completion(self, index: int, text: str, finish_reason: str | None) -> bytes:
        choice = b'{"index":%d,"text":%s,"logprobs":null,"finish_reason":%s}'
        return self._event(choice % (index, _text(text), _text(finish_reason)))

    def _event(self, choice: bytes) -> bytes:
        return self._head + choice + self._tail


def _text(value: str | None) -> bytes:
    return b"null" if value is None else _dumps(value).encode()


class SSEResponse(StreamingResponse):
    def __init__(self, events: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


async def with_error_events(events: AsyncIterator[bytes], scope: Scope) -> AsyncIterator[bytes]:
    """Pass events through, turn a failure into an error event (logged once, with the request
    in `scope`), and always end with [DONE]."""
    try:
        async for event in events:
            yield event
    except (APIError, EngineDeadError) as exc:
        error = exc if isinstance(exc, APIError) else APIError(503, str(exc))
        log_failure(scope, error.status_code, ERROR_TYPES[error.status_code], error.message)
        yield sse_event(error.body())
    except Exception as exc:  # a bug: report it in-band rather than cutting the stream
        log_failure(scope, 500, type(exc).__name__, str(exc)[:500])
        logger.debug("traceback of the failed stream", exc_info=exc)
        yield sse_event(APIError(500, f"internal error: {type(exc).__name__}").body())
    yield SSE_DONE


def raise_if_failed(output: RequestOutput, guided_field: str = "guided") -> None:
    """A failed output as its API error: 400 naming the request's field where the engine
    blames the request (a grammar the model's vocabulary cannot continue: `guided_field`,
    the field the client sent it in), else 500."""
    if output.finish_reason != "error":
        return
    if output.error_param == "guided" and output.error:
        raise bad_request(guided_field + output.error.removeprefix("guided"), guided_field)
    raise APIError(500, f"generation failed: {output.error or 'unknown engine error'}")


async def merge_streams(
    streams: Sequence[RequestStream],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(stream position, output) from several streams as outputs arrive; errors propagate."""
    if len(streams) == 1:
        async for output in streams[0]:
            yield 0, output
        return
    queue: asyncio.Queue[tuple[int, RequestOutput | BaseException | None]] = asyncio.Queue()

    async def pump(position: int, stream: RequestStream) -> None:
        try:
            async for output in stream:
                queue.put_nowait((position, output))
            queue.put_nowait((position, None))
        except Exception as exc:
            queue.put_nowait((position, exc))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        num_open = len(tasks)
        while num_open:
            position, item = await queue.get()
            if item is None:
                num_open -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield position, item
    finally:
        for task in tasks:
            task.cancel()
