"""LLMEngine: one step of continuous batching with optional speculation (DESIGN §1), and where
a request enters the engine: add_request checks it once and admit() queues it as n Requests.
The Request is its one owner: whatever the components keep about it (prefix hashes,
speculation state, output state) hangs off it, so finishing a request (stop, length, abort,
error) frees one thing, its KV blocks, in one place (Scheduler._finish). The model runner keeps
no per-request state. Not thread-safe: AsyncEngine calls it from a single thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.models.loader import resolve_model_path
from engine.models.tokenizer import Tokenizer
from engine.output.output_processor import OutputProcessor
from engine.outputs import (
    Drafts,
    EngineStats,
    ModelOutput,
    RequestOutput,
    SchedulerOutput,
)
from engine.request import Request, RequestStatus, check_request
from engine.runner.model_runner import ModelRunner
from engine.runner.step_isolation import describe, execute_isolating
from engine.runner.step_timer import StepTimer
from engine.sampling_params import SamplingParams
from engine.speculation.build import build_spec_driver
from engine.structured.grammar import GrammarCompiler

logger = logging.getLogger(__name__)
T = TypeVar("T")


class LLMEngine:
    def __init__(
        self, config: EngineConfig, runner: ModelRunner, tokenizer: Tokenizer | None
    ) -> None:
        self.config = config
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_name = _model_name(config.model.model)
        self.vocab_size = runner.arch.vocab_size
        self.max_model_len = _servable_len(
            runner.max_model_len, runner.num_blocks, config.cache.block_size
        )
        self.eos_token_ids = _eos_ids(runner.arch, tokenizer)
        self.scheduler = Scheduler(
            config.scheduler, config.cache, runner.num_blocks, runner.kv_split.window
        )
        timer = StepTimer(runner, self.scheduler.block_manager, seed=config.model.seed)
        self.spec = build_spec_driver(config.spec, runner, config.scheduler, timer)
        self.outputs = OutputProcessor(tokenizer, self.spec.proposer_name)
        self.grammars = GrammarCompiler(tokenizer, self.vocab_size, self.eos_token_ids)
        self._aborted: list = []
        self._started_ids: list[str] = []  # caller ids first scheduled in the last step
        self._num_steps = 0
        self._generation_tokens = 0
        self._last_step_time = 0.0

    @classmethod
    def from_config(
        cls, config: EngineConfig | None = None, tokenizer: Future[Tokenizer | None] | None = None
    ) -> LLMEngine:
        """Load the model, and meanwhile its tokenizer: from `tokenizer`, a future the caller
        fulfils (the server reads it on its own thread: server/cli.py load_engine), or else
        on a second thread here. The tokenizer's parse holds the GIL (~0.3 s for 152k tokens);
        the model's long parts (tile packing, the KV cache) release it."""
        config = config or EngineConfig()
        if tokenizer is None:
            tokenizer = _in_background(Tokenizer.from_path, resolve_model_path(config.model.model))
        runner = ModelRunner(config)
        return cls(config, runner, tokenizer.result())

    # ---- requests ------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        final_only: bool = False,
    ) -> None:
        """Check the request (ValueError: a live id, a bad prompt or token id) and admit it.
        final_only: step() reports it once, finished (offline callers that want no stream)."""
        ids = {request_id, *choice_ids(request_id, params.n)}
        if any(self.scheduler.requests_of(i) for i in ids):
            raise ValueError(f"request_id {request_id!r} is already in use")
        check_request(prompt_token_ids, params, self.vocab_size, self.max_model_len)
        self.admit(request_id, prompt_token_ids, params, arrival_time, final_only)

    def admit(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        final_only: bool = False,
    ) -> None:
        """Queue a checked request as one Request per choice (AsyncEngine checks on the event
        loop, so the engine thread does not check again); a grammar that does not compile is
        a ValueError naming `guided`."""
        guided = params.guided
        grammars = [self.grammars.matcher(guided) for _ in range(params.n)] if guided else None
        arrival = arrival_time if arrival_time is not None else time.monotonic()
        child_ids = choice_ids(request_id, params.n)
        base_seed = params.seed if params.seed is not None else random.getrandbits(62)
        for index, child_id in enumerate(child_ids):
            request = Request(
                request_id=child_id,
                prompt_token_ids=list(prompt_token_ids),
                sampling_params=params,
                eos_token_ids=self.eos_token_ids,
                max_total_tokens=self.max_model_len,
                arrival_time=arrival,
                parent_request_id=child_ids[0] if index > 0 else None,
                group_id=request_id if params.n > 1 else None,
                index=index,
                seed=base_seed + index,
                grammar=grammars[index] if grammars else None,
            )
            self.outputs.add(request, final_only)
            self.scheduler.add_request(request)

    def abort_request(self, request_id: str) -> None:
        """Abort a request, or all live choices of the n > 1 request it names."""
        ids = [request.request_id for request in self.scheduler.requests_of(request_id)]
        # Reported (finish_reason "abort") by the next step(), so metrics and callers see them.
        self._aborted.extend(self.scheduler.abort_requests(ids))

    def has_unfinished_requests(self) -> bool:
        return bool(self._aborted) or self.scheduler.has_unfinished_requests()

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        plan = self.spec.plan(
            self.scheduler.running, self.scheduler.waiting
        )  # 1. draft tokens per request
        start = time.monotonic()
        sched = self.scheduler.schedule(plan)  # 2. token budget, KV blocks, preemption
        self._started_ids = _first_scheduled_ids(sched, start)
        drafts = self.spec.propose(sched)  # 3. chains or trees for the planned requests
        out = self._execute(sched, drafts)  # 4. one forward + batched verification
        changed = self.scheduler.update(sched, out)  # 5. append, roll back, finish, free
        self.spec.observe(sched, drafts, out)  # 6. acceptance + step-time feedback
        return self._collect(sched, out, changed)

    def _execute(self, sched: SchedulerOutput, drafts: Drafts) -> ModelOutput:
        """Run the model; a failing request fails alone (engine/runner/step_isolation.py)."""
        if sched.is_empty:
            return ModelOutput(outputs={})
        self._num_steps += 1
        out = execute_isolating(self.runner, sched, drafts)
        self._last_step_time = out.step_time + drafts.proposer_time + self.spec.last_plan_time
        return out

    def _collect(
        self, sched: SchedulerOutput, model_output: ModelOutput, changed: list[Request]
    ) -> list[RequestOutput]:
        """RequestOutputs for the requests aborted since the last step and those that changed."""
        changed = self._aborted + changed
        self._aborted = []
        for scheduled in sched.scheduled:
            step_output = model_output.outputs.get(scheduled.request_id)
            if step_output is not None:
                self.outputs.record_step(scheduled.request, step_output)
        results: list[RequestOutput] = []
        for request in changed:
            output = self._make_output(request)
            if output is None:
                continue
            self._generation_tokens += len(output.new_token_ids)
            results.append(output)
        return results

    def _make_output(self, request: Request) -> RequestOutput | None:
        """The request's output (detokenized, stop strings applied); if that fails (e.g. a token
        its tokenizer cannot decode), the request finishes with the error and the others go on."""
        try:
            output, stop_string = self.outputs.make_output(request)
        except Exception as exc:  # reported in the output's error (the server logs it)
            logger.debug("request %s failed making its output", request.request_id, exc_info=exc)
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_ERROR)
            return self.outputs.fail(request, f"making the output failed: {describe(exc)}")
        if stop_string is not None and not request.is_finished:
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
        return output

    # ---- introspection -------------------------------------------------------------------
    def started_request_ids(self) -> list[str]:
        """Caller ids (the group id for n > 1) of requests the last step scheduled for the first
        time: they left the queue (the server sends a stream's headers then)."""
        return self._started_ids

    def stats(self) -> EngineStats:
        scheduler = self.scheduler
        blocks = scheduler.block_manager
        return EngineStats(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_free_blocks=blocks.num_free_blocks,
            num_total_blocks=blocks.num_total_blocks,
            num_steps_total=self._num_steps,
            prompt_tokens_total=scheduler.num_prompt_tokens_computed_total,
            generation_tokens_total=self._generation_tokens,
            num_preemptions_total=scheduler.num_preemptions_total,
            prefix_cache_queries_total=blocks.prefix_cache_queries,
            prefix_cache_hits_total=blocks.prefix_cache_hits,
            last_step_time=self._last_step_time,
            **self.spec.stats_fields(),
        )


def choice_ids(request_id: str, n: int) -> list[str]:
    """The engine's ids of a request's n choices: its own id, or `{id}-{i}` for n > 1."""
    return [request_id] if n == 1 else [f"{request_id}-{i}" for i in range(n)]


def _in_background(work: Callable[..., T], *args: Any) -> Future[T]:
    """work(*args) on a daemon thread (Ctrl-C during a load does not wait for it); the
    future holds its result or its exception."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(work(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller as is
            future.set_exception(exc)

    threading.Thread(target=run, name="goodspeed-tokenizer", daemon=True).start()
    return future


def _model_name(model: str) -> str:
    path = Path(model)
    if path.suffix == ".gguf":
        return path.stem
    return path.name if path.name else model


def _servable_len(max_model_len: int, num_blocks: int, block_size: int) -> int:
    """The longest sequence this engine can hold: the context length, or the whole KV pool when
    that is smaller, so a request that could never fit is refused at admission (a 400) instead
    of failing after it has generated."""
    capacity = num_blocks * block_size
    if capacity < max_model_len:
        logger.warning(
            "the KV cache holds %d tokens, fewer than the context length %d: requests are "
            "limited to %d tokens (prompt + max_tokens)",
            capacity,
            max_model_len,
            capacity,
        )
    return min(max_model_len, capacity)


def _eos_ids(arch, tokenizer) -> tuple[int, ...]:
    ids = list(getattr(arch, "eos_token_ids", ()) or ())
    if (
        tokenizer is not None
        and tokenizer.eos_token_id is not None
        and tokenizer.eos_token_id not in ids
    ):
        ids.append(tokenizer.eos_token_id)
    return tuple(ids)


def _first_scheduled_ids(sched: SchedulerOutput, since: float) -> list[str]:
    ids = []
    for scheduled in sched.scheduled:
        request = scheduled.request
        first = request.first_scheduled_time
        if first is not None and first >= since:
            ids.append(request.group_id or request.request_id)
    return list(dict.fromkeys(ids))
