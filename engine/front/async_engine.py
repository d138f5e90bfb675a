"""AsyncEngine: LLMEngine for asyncio callers, one RequestStream per request.

The engine runs on one background thread (engine/front/engine_worker.py, which states the threading
contract); this side lives on the event loop: it submits commands to the worker and owns the
per-request state (`_streams`, each stream's asyncio.Queue), which only the loop touches.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import Future
from typing import Any

from engine.front.engine_worker import (
    Abort,
    Add,
    Engine,
    EngineWorker,
    ShortLivedThread,
    StatLogger,
)
from engine.front.request_stream import EngineDeadError, QueueFullError, RequestStream
from engine.outputs import EngineStats, RequestOutput
from engine.request import check_request
from engine.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "EngineDeadError", "QueueFullError", "RequestStream", "StatLogger"]

logger = logging.getLogger(__name__)


class AsyncEngine:
    """One engine thread stepping LLMEngine; asyncio callers get per-request RequestStreams."""

    def __init__(
        self,
        engine: Engine,
        stat_loggers: Sequence[StatLogger] = (),
        max_num_in_flight: int | None = None,
    ) -> None:
        self.engine = engine
        self.max_num_in_flight = max_num_in_flight  # sequences (n counts n); None = no limit
        self._streams: dict[str, RequestStream] = {}
        self._worker = EngineWorker(engine, stat_loggers, self._deliver, self._fail_all)

    @property
    def stat_loggers(self) -> list[StatLogger]:
        """Called after every step on the engine thread; append before start()."""
        return self._worker.stat_loggers

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> AsyncEngine:
        """Load the model off the calling thread, so that only the engine thread ever keeps an
        OpenMP pool (engine/front/engine_worker.py says why that matters)."""
        return cls.start_loading(config, **kwargs).result()

    @classmethod
    def start_loading(
        cls, config: Any, tokenizer: Future | None = None, **kwargs: Any
    ) -> ShortLivedThread[AsyncEngine]:
        """from_config's load, begun: the calling thread is free until `.result()`.
        tokenizer: a future the caller fulfils with the model's tokenizer (LLMEngine.from_config);
        None: the load reads it on a thread of its own."""
        from engine.llm_engine import LLMEngine  # torch, imported on this thread

        def load() -> AsyncEngine:
            return cls(LLMEngine.from_config(config, tokenizer), **kwargs)

        return ShortLivedThread(load)

    # ---- read-only facts of the wrapped engine (immutable, safe from any thread) ------------
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def vocab_size(self) -> int:
        return self.engine.vocab_size

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the engine thread; outputs are delivered on `loop` (default: the running one)."""
        self._worker.start(loop or asyncio.get_running_loop())

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; streams still open end with EngineDeadError."""
        self._worker.stop(timeout)
        self._fail_all("the engine was shut down")

    @property
    def is_healthy(self) -> bool:
        return self._worker.is_running

    @property
    def dead_error(self) -> str | None:
        return self._worker.dead_error

    @property
    def num_in_flight(self) -> int:
        """Sequences admitted and not yet finished (a request with n choices counts n)."""
        return sum(s.num_choices for s in self._streams.values())

    def stats(self) -> EngineStats:
        """The snapshot taken after the engine thread's latest step or command batch."""
        return self._worker.last_stats

    async def wait_until_idle(self, timeout: float | None = None, poll: float = 0.05) -> bool:
        """Wait until no request is in flight; False if `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._streams:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            await asyncio.sleep(poll)
        return True

    # ---- requests (event-loop side) ------------------------------------------------------------
    async def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> RequestStream:
        """Admit a request; raises ValueError (bad input), QueueFullError or EngineDeadError.
        Its input is checked here, once, before the engine thread sees it."""
        self._check_admission(request_id, prompt_token_ids, params)
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, params.n, self.abort)
        self._streams[request_id] = stream
        future: asyncio.Future[None] = loop.create_future()
        try:
            self._worker.submit(
                Add(request_id, list(prompt_token_ids), params, arrival_time, future)
            )
            await future
        except asyncio.CancelledError:
            self.abort(request_id)  # the add may be applied anyway; the abort is queued after it
            raise
        except BaseException:
            self._streams.pop(request_id, None)  # the engine refused it: nothing to abort
            raise
        return stream

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Outputs of one request as they come; aborts it if the caller stops iterating early."""
        stream = await self.add_request(request_id, prompt_token_ids, params, arrival_time)
        try:
            async for output in stream:
                yield output
        finally:
            stream.close()

    def abort(self, request_id: str) -> None:
        """Abort a request (and its n > 1 children) unless it already finished."""
        stream = self._streams.pop(request_id, None)
        if stream is None or self._worker.dead_error is not None:
            return
        try:
            self._worker.submit(Abort(request_id))
        except EngineDeadError:
            pass

    def abort_all(self, reason: str) -> None:
        """Abort every request in flight; their streams end with EngineDeadError(reason)."""
        for request_id, stream in list(self._streams.items()):
            self.abort(request_id)
            stream.put(EngineDeadError(reason))

    def _check_admission(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        worker = self._worker
        if worker.dead_error is not None or not worker.started:
            raise EngineDeadError(worker.dead_error or "the engine is not running")
        if request_id in self._streams:  # the one duplicate check: ids of requests in flight
            raise ValueError(f"request_id {request_id!r} is already in use")
        check_request(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        num_choices = params.n
        limit = self.max_num_in_flight
        if limit is not None and num_choices > limit:  # never admissible: not a retry case
            raise ValueError(f"n: {num_choices} sequences exceed the in-flight limit {limit}")
        if limit is not None and self.num_in_flight + num_choices > limit:
            raise QueueFullError(
                f"server busy: {self.num_in_flight} sequences in flight, limit {limit}; retry later"
            )

    # ---- event-loop callbacks (scheduled by the engine thread) ---------------------------------
    def _deliver(self, outputs: list[RequestOutput], started: list[str]) -> None:
        for request_id in started:
            stream = self._streams.get(request_id)
            if stream is not None:
                stream.started.set()
        for output in outputs:
            key = output.group_id if output.group_id is not None else output.request_id
            stream = self._streams.get(key)
            if stream is None:
                continue  # aborted or closed by its consumer
            stream.put(output)
            if stream.finished:
                del self._streams[key]

    def _fail_all(self, message: str) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put(EngineDeadError(message))
