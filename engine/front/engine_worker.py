"""EngineWorker: the one thread that runs LLMEngine (AsyncEngine's engine side).

Threading contract (the invariant everything here relies on):
- Every call into the wrapped engine (admit, abort_request, step, stats,
  has_unfinished_requests) happens on this thread, so LLMEngine needs no locks.
- Other threads only append commands to `_commands` under `_cond` (submit); this thread applies
  them before each step, in submission order (an abort queued after an add always finds it),
  and hands results back to the event loop with `loop.call_soon_threadsafe`.
- No other thread runs multi-threaded torch work either, not even before the worker starts:
  OpenMP keeps a thread pool per thread that ever ran a parallel region, and libgomp stops
  spin-waiting once its pools' threads outnumber the CPUs (with threads = cores, a second pool
  is enough): every barrier then sleeps on a futex, ~200 context switches per decode step.
  Hence AsyncEngine.from_config loads the model with `on_short_lived_thread`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from engine.front.request_stream import EngineDeadError
from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

T = TypeVar("T")

_STALL_WAIT_S = 0.005  # pause after a step that could schedule nothing


class StatLogger(Protocol):
    def on_step(self, stats: EngineStats, outputs: Sequence[RequestOutput], now: float) -> None: ...


class Engine(Protocol):
    """What the worker needs of LLMEngine (tests substitute a fake)."""

    tokenizer: Any
    model_name: str
    max_model_len: int
    vocab_size: int

    def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None: ...  # a request AsyncEngine checked on the event loop
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def started_request_ids(self) -> list[str]: ...  # first scheduled by the last step
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> EngineStats: ...


@dataclass
class Add:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float | None
    future: asyncio.Future[None]


@dataclass
class Abort:
    request_id: str


class EngineWorker:
    """Steps the engine on its own thread; `deliver` and `fail_all` run on the event loop."""

    def __init__(
        self,
        engine: Engine,
        stat_loggers: Sequence[StatLogger],
        deliver: Callable[[list[RequestOutput], list[str]], None],
        fail_all: Callable[[str], None],
    ) -> None:
        self.engine = engine
        self.stat_loggers = list(stat_loggers)
        self._deliver = deliver
        self._fail_all = fail_all
        self._cond = threading.Condition()
        self._commands: list[Add | Abort] = []
        self._stopping = False
        self.dead_error: str | None = None
        self.last_stats = engine.stats()  # lists the proposers before the first step
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- any thread ----------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._thread is not None:
            return
        self._loop = loop
        self.last_stats = self.engine.stats()
        self._thread = threading.Thread(target=self._run, name="goodspeed-engine", daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and self.dead_error is None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def submit(self, command: Add | Abort) -> None:
        with self._cond:
            if self.dead_error is not None or self._stopping:
                raise EngineDeadError(self.dead_error or "the engine is shutting down")
            self._commands.append(command)
            self._cond.notify()

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
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
                num_steps_before = self.last_stats.num_steps_total
                outputs = self.engine.step() if stepped else []
                started = self.engine.started_request_ids() if stepped else []
                self._publish(outputs, started, stepped or bool(commands))
                if stepped and not outputs and self.last_stats.num_steps_total == num_steps_before:
                    self._wait_for_commands(_STALL_WAIT_S)
        except BaseException as exc:  # noqa: BLE001 - any crash must fail the waiting requests
            logger.exception("engine thread died")
            self._die(f"engine thread died: {type(exc).__name__}: {exc}")

    def _next_commands(self) -> tuple[list[Add | Abort], bool]:
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

    def _stop(self, commands: list[Add | Abort]) -> None:
        """Last pass: apply queued aborts (freeing their blocks); refuse queued adds."""
        for command in commands:
            if isinstance(command, Abort):
                self.engine.abort_request(command.request_id)
            else:
                self.call_soon(
                    _resolve, command.future, EngineDeadError("the engine was shut down")
                )
        self.last_stats = self.engine.stats()

    def _apply(self, commands: list[Add | Abort]) -> None:
        for command in commands:
            if isinstance(command, Abort):
                self.engine.abort_request(command.request_id)
                continue
            error: BaseException | None = None
            try:
                self.engine.admit(
                    command.request_id,
                    command.prompt_token_ids,
                    command.params,
                    command.arrival_time,
                )
            except Exception as exc:  # ValueError = a bad grammar; anything else is reported too
                error = exc
            self.call_soon(_resolve, command.future, error)

    def _publish(
        self, outputs: list[RequestOutput], started: list[str], notify_loggers: bool
    ) -> None:
        stats = self.engine.stats()
        self.last_stats = stats
        if notify_loggers:
            now = time.monotonic()
            for stat_logger in self.stat_loggers:
                try:
                    stat_logger.on_step(stats, outputs, now)
                except Exception:  # metrics must never take the engine down
                    logger.exception("stat logger %r failed", stat_logger)
        if outputs or started:
            self.call_soon(self._deliver, outputs, started)

    def _die(self, message: str) -> None:
        with self._cond:
            self.dead_error = message
            commands, self._commands = self._commands, []
        for command in commands:
            if isinstance(command, Add):
                self.call_soon(_resolve, command.future, EngineDeadError(message))
        self.call_soon(self._fail_all, message)


def on_short_lived_thread(work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on a new thread that exits when it returns (its OpenMP pool goes with it);
    its exception is raised here."""
    return ShortLivedThread(work, *args).result()


class ShortLivedThread(Generic[T]):
    """on_short_lived_thread, begun: the calling thread is free until `result()`, which
    returns once the thread has exited."""

    def __init__(self, work: Callable[..., T], *args: Any) -> None:
        self._results: list[T] = []
        self._errors: list[BaseException] = []

        def run() -> None:
            try:
                self._results.append(work(*args))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller as is
                self._errors.append(exc)

        # Daemon: Ctrl-C during a long model load ends the process instead of waiting for it.
        self._thread = threading.Thread(target=run, name="goodspeed-load", daemon=True)
        self._thread.start()

    def result(self) -> T:
        self._thread.join()
        if self._errors:
            raise self._errors[0]
        return self._results[0]


def _resolve(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled meanwhile
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
