"""AsyncEngine: runs LLMEngine.step() on one background thread and streams outputs to asyncio.

Threading contract (the invariant everything here relies on):
- Every call into the wrapped engine (add_request, abort_request, step, stats,
  has_unfinished_requests) happens on the engine thread, so LLMEngine needs no locks.
- The event loop only appends commands to `_commands` under `_cond`; the engine thread applies
  them before each step and hands results back with `loop.call_soon_threadsafe`.
- Per-request state (`_streams`, each stream's asyncio.Queue) is touched by the event loop only.
Commands are applied in submission order, so an abort queued after an add always finds it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.outputs import EngineStats, RequestOutput
from engine.request_stream import EngineDeadError, QueueFullError, RequestStream
from engine.sampling_params import SamplingParams

__all__ = ["AsyncEngine", "EngineDeadError", "QueueFullError", "RequestStream", "StatLogger"]

logger = logging.getLogger(__name__)

_STALL_WAIT_S = 0.005  # pause after a step that could schedule nothing


class StatLogger(Protocol):
    def on_step(self, stats: EngineStats, outputs: Sequence[RequestOutput], now: float) -> None: ...


class Engine(Protocol):
    """What AsyncEngine needs of LLMEngine (tests substitute a fake)."""

    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> EngineStats: ...


@dataclass
class _Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float | None
    future: asyncio.Future[None]


@dataclass
class _Abort:
    request_id: str


class AsyncEngine:
    """One engine thread stepping LLMEngine; asyncio callers get per-request RequestStreams."""

    def __init__(
        self,
        engine: Engine,
        stat_loggers: Sequence[StatLogger] = (),
        max_num_in_flight: int | None = None,
    ) -> None:
        self.engine = engine
        self.stat_loggers = list(stat_loggers)
        self.max_num_in_flight = max_num_in_flight  # sequences (n counts n); None = no limit
        self._cond = threading.Condition()
        self._commands: list[_Add | _Abort] = []
        self._stopping = False
        self._dead_error: str | None = None
        self._streams: dict[str, RequestStream] = {}
        self._last_stats = EngineStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> AsyncEngine:
        from engine.llm_engine import LLMEngine

        return cls(LLMEngine.from_config(config), **kwargs)

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
        if self._thread is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._last_stats = self.engine.stats()
        self._thread = threading.Thread(target=self._run, name="goodspeed-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; streams still open end with EngineDeadError."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
        self._fail_all("the engine was shut down")

    @property
    def is_healthy(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and self._dead_error is None

    @property
    def dead_error(self) -> str | None:
        return self._dead_error

    @property
    def num_in_flight(self) -> int:
        """Sequences admitted and not yet finished (a request with n choices counts n)."""
        return sum(s.num_choices for s in self._streams.values())

    def stats(self) -> EngineStats:
        """The snapshot taken after the engine thread's latest step or command batch."""
        return self._last_stats

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
        """Admit a request; raises ValueError (bad input), QueueFullError or EngineDeadError."""
        self._check_admission(request_id, params.n)
        loop = asyncio.get_running_loop()
        stream = RequestStream(request_id, params.n, self.abort)
        self._streams[request_id] = stream
        future: asyncio.Future[None] = loop.create_future()
        try:
            self._submit(_Add(request_id, list(prompt_token_ids), params, arrival_time, future))
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
        if stream is None or self._dead_error is not None:
            return
        try:
            self._submit(_Abort(request_id))
        except EngineDeadError:
            pass

    def abort_all(self, reason: str) -> None:
        """Abort every request in flight; their streams end with EngineDeadError(reason)."""
        for request_id, stream in list(self._streams.items()):
            self.abort(request_id)
            stream.put(EngineDeadError(reason))

    def _check_admission(self, request_id: str, num_choices: int) -> None:
        if self._dead_error is not None or self._thread is None:
            raise EngineDeadError(self._dead_error or "the engine is not running")
        if request_id in self._streams:
            raise ValueError(f"request_id {request_id!r} is already in use")
        limit = self.max_num_in_flight
        if limit is not None and self.num_in_flight + num_choices > limit:
            raise QueueFullError(
                f"server busy: {self.num_in_flight} sequences in flight, limit {limit}; retry later"
            )

    def _submit(self, command: _Add | _Abort) -> None:
        with self._cond:
            if self._dead_error is not None or self._stopping:
                raise EngineDeadError(self._dead_error or "the engine is shutting down")
            self._commands.append(command)
            self._cond.notify()

    # ---- event-loop callbacks (scheduled by the engine thread) ---------------------------------
    def _deliver(self, outputs: list[RequestOutput]) -> None:
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

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    # ---- engine thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                commands, stopping = self._next_commands()
                if stopping:
                    self._stop(commands)
                    return
                self._apply(commands)
                stepped = self.engine.has_unfinished_requests()
                num_steps_before = self._last_stats.num_steps_total
                outputs = self.engine.step() if stepped else []
                self._publish(outputs, stepped or bool(commands))
                if stepped and not outputs and self._last_stats.num_steps_total == num_steps_before:
                    self._wait_for_commands(_STALL_WAIT_S)
        except BaseException as exc:  # noqa: BLE001 - any crash must fail the waiting requests
            logger.exception("engine thread died")
            self._die(f"engine thread died: {type(exc).__name__}: {exc}")

    def _next_commands(self) -> tuple[list[_Add | _Abort], bool]:
        """Block while idle; return the queued commands and whether to stop."""
        with self._cond:
            while not (self._commands or self._stopping or self.engine.has_unfinished_requests()):
                self._cond.wait()
            commands, self._commands = self._commands, []
            return commands, self._stopping

    def _wait_for_commands(self, timeout: float) -> None:
        """Nothing could be scheduled (e.g. every request waits for KV blocks): rather than
        spin on empty steps, sleep until a command arrives or `timeout` passes."""
        with self._cond:
            if not (self._commands or self._stopping):
                self._cond.wait(timeout)

    def _stop(self, commands: list[_Add | _Abort]) -> None:
        """Last pass: apply queued aborts (freeing their blocks); refuse queued adds."""
        for command in commands:
            if isinstance(command, _Abort):
                self.engine.abort_request(command.request_id)
            else:
                self._call_soon(
                    _resolve, command.future, EngineDeadError("the engine was shut down")
                )
        self._last_stats = self.engine.stats()

    def _apply(self, commands: list[_Add | _Abort]) -> None:
        for command in commands:
            if isinstance(command, _Abort):
                self.engine.abort_request(command.request_id)
                continue
            error: BaseException | None = None
            try:
                self.engine.add_request(
                    command.request_id,
                    command.prompt_token_ids,
                    command.params,
                    command.arrival_time,
                )
            except Exception as exc:  # ValueError = bad input; anything else is reported too
                error = exc
            self._call_soon(_resolve, command.future, error)

    def _publish(self, outputs: list[RequestOutput], notify_loggers: bool) -> None:
        stats = self.engine.stats()
        self._last_stats = stats
        if notify_loggers:
            now = time.monotonic()
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger.on_step(stats, outputs, now)
                except Exception:  # metrics must never take the engine down
                    logger.exception("stat logger %r failed", stat_logger)
        if outputs:
            self._call_soon(self._deliver, outputs)

    def _die(self, message: str) -> None:
        with self._cond:
            self._dead_error = message
            commands, self._commands = self._commands, []
        for command in commands:
            if isinstance(command, _Add):
                self._call_soon(_resolve, command.future, EngineDeadError(message))
        self._call_soon(self._fail_all, message)


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
