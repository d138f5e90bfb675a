"""Scheduler: continuous batching with chunked prefill, prefix caching, speculation slots and
preemption by recompute (DESIGN §3-4). Pure Python, no torch.

One accounting rule covers every case (as in vLLM v1): a scheduled request computes
all_token_ids[num_computed_tokens : num_computed_tokens + n] with n = min(tokens not yet
computed, budget left); that is a prefill chunk, or 1 when the request is caught up, and only a
caught-up request may add reserved draft slots. Each step serves running requests first (in
arrival order), then admits waiting ones first-come-first-served while budget, seats and KV
blocks allow. When blocks run out the latest-arrived running request is preempted: its blocks
are freed and it goes back to the front of the queue to be recomputed (prefix cache helps).
"""

from __future__ import annotations

import bisect
import itertools
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import CacheConfig, SchedulerConfig
from engine.core.block_manager import BlockCopy, BlockManager, SharedBlocks, WindowGroup
from engine.outputs import (
    ModelOutput,
    RequestStepOutput,
    ScheduledRequest,
    SchedulerOutput,
    SpecPlan,
)
from engine.request import Request, RequestStatus


@dataclass
class _Step:
    """What one schedule() call is building."""

    budget: int
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    block_copies: list[BlockCopy] = field(default_factory=list)

    def add(
        self, request: Request, num_new: int, num_draft_tokens: int, copies: list[BlockCopy]
    ) -> None:
        start = request.num_computed_tokens
        self.scheduled.append(
            ScheduledRequest(request, num_new + num_draft_tokens, num_draft_tokens, start)
        )
        self.block_copies.extend(copies)
        self.budget -= num_new + num_draft_tokens

    def build(self) -> SchedulerOutput:
        return SchedulerOutput(
            scheduled=tuple(self.scheduled),
            preempted=tuple(self.preempted),
            block_copies=tuple(self.block_copies),
            num_batched_tokens=sum(s.num_new_tokens for s in self.scheduled),
        )


class Scheduler:
    def __init__(
        self,
        scheduler_config: SchedulerConfig,
        cache_config: CacheConfig,
        num_blocks: int,
        window: WindowGroup | None = None,
    ) -> None:
        self.config = scheduler_config
        self.block_manager = BlockManager(
            num_blocks, cache_config.block_size, cache_config.enable_prefix_caching, window
        )
        self.waiting: deque[Request] = deque()  # FCFS; preempted requests re-enter at the front
        self.running: list[Request] = []  # sorted by arrival: the last one is preempted first
        self._requests: dict[str, Request] = {}  # every unfinished request
        self._arrival_counter = itertools.count()
        self._finished_in_schedule: list[Request] = []  # reported by the next update()
        self.num_preemptions_total = 0
        self.num_prompt_tokens_computed_total = 0

    # ---- requests ------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        """Queue a request the engine checked (its id is unique among live requests)."""
        request.status = RequestStatus.WAITING
        request.arrival_index = next(self._arrival_counter)
        self._requests[request.request_id] = request
        self.waiting.append(request)

    def abort_requests(self, request_ids: Iterable[str]) -> list[Request]:
        """Abort requests in any state; unknown or already finished ids are skipped."""
        aborted = []
        for request_id in request_ids:
            request = self._requests.get(request_id)
            if request is not None:
                self._finish(request, RequestStatus.FINISHED_ABORTED)
                aborted.append(request)
        return aborted

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        if not status.finished:
            raise ValueError(f"finish_request needs a FINISHED_* status, got {status}")
        request = self._requests.get(request_id)
        if request is not None:
            self._finish(request, status)
        return request

    def get_request(self, request_id: str) -> Request | None:
        return self._requests.get(request_id)

    def requests_of(self, request_id: str) -> list[Request]:
        """The live request with this id, or the live choices of the n > 1 request it names."""
        request = self._requests.get(request_id)
        if request is not None:
            return [request]
        return [r for r in self._requests.values() if r.group_id == request_id]

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests) or bool(self._finished_in_schedule)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    # ---- schedule ------------------------------------------------------------------------
    def schedule(self, plan: SpecPlan) -> SchedulerOutput:
        step = _Step(budget=self.config.max_num_batched_tokens)
        self._schedule_running(plan, step)
        if not step.preempted:  # admitting now would only evict what we just preempted
            self._schedule_waiting(plan, step)
        return step.build()

    def _schedule_running(self, plan: SpecPlan, step: _Step) -> None:
        index = 0
        while index < len(self.running) and step.budget > 0:
            request = self.running[index]
            if self._reserve_running(request, plan, step):
                index += 1
            elif index == 0:  # alone in the cache and still does not fit: it never will
                self._finish_in_schedule(request, self._too_big_message(request))
            else:
                self._preempt(request, step)

    def _reserve_running(self, request: Request, plan: SpecPlan, step: _Step) -> bool:
        """Reserve slots, preempting later arrivals as needed; False if it cannot fit itself."""
        start = request.num_computed_tokens
        num_new, num_draft_tokens = self._num_new_tokens(request, start, plan, step.budget)
        while True:
            copies = self.block_manager.allocate_slots(request, start, num_new + num_draft_tokens)
            if copies is not None:
                step.add(request, num_new, num_draft_tokens, copies)
                return True
            if num_draft_tokens > 0:  # drafts are optional: drop them before preempting anyone
                num_draft_tokens = 0
                continue
            victim = self.running[-1]
            if victim is request:
                return False
            self._preempt(victim, step)

    def _schedule_waiting(self, plan: SpecPlan, step: _Step) -> None:
        for request in list(self.waiting):
            if step.budget <= 0 or len(self.running) >= self.config.max_num_seqs:
                return
            parent = self._live_parent(request)
            if parent is not None and not _has_computed_prompt(parent, request):
                continue  # n > 1 child: wait to fork the parent's prompt blocks
            if not self._fits_cache(request):
                self._finish_in_schedule(request, self._too_big_message(request))
                continue
            if not self._admit(request, parent, plan, step):
                return  # FCFS: nobody overtakes a request that is waiting for blocks

    def _admit(self, request: Request, parent: Request | None, plan: SpecPlan, step: _Step) -> bool:
        # n > 1 child: share the parent's prompt blocks (None: its window slid past them)
        shared = (
            None
            if parent is None
            else self.block_manager.fork_blocks(parent, request.num_prompt_tokens)
        )
        forked = shared is not None
        if forked:
            num_computed = request.num_prompt_tokens - 1  # recompute the last prompt token
        else:
            shared = self._cached_prefix(request)
            num_computed = len(shared.block_ids) * self.block_manager.block_size
        num_new, num_draft_tokens = self._num_new_tokens(request, num_computed, plan, step.budget)
        copies = self.block_manager.allocate_slots(
            request, num_computed, num_new + num_draft_tokens, shared
        )
        if copies is None and num_draft_tokens > 0:
            num_draft_tokens = 0
            copies = self.block_manager.allocate_slots(request, num_computed, num_new, shared)
        if copies is None:
            return False
        if not forked:
            self.block_manager.record_prefix_query(request.num_tokens, num_computed)
        request.num_computed_tokens = request.num_cached_tokens = num_computed
        request.status = RequestStatus.RUNNING
        if request.first_scheduled_time is None:
            request.first_scheduled_time = time.monotonic()
        self.waiting.remove(request)
        bisect.insort(self.running, request, key=lambda r: r.arrival_index)
        step.add(request, num_new, num_draft_tokens, copies)
        return True

    def _cached_prefix(self, request: Request) -> SharedBlocks:
        if request.sampling_params.prompt_logprobs is not None:
            return SharedBlocks([])  # every prompt position must be computed for its logprobs
        return self.block_manager.find_cached_prefix(request)

    def _live_parent(self, request: Request) -> Request | None:
        """The parent an n > 1 child forks from (or waits for); None: prefill on its own, e.g.
        once the parent finished or was preempted (then the prefix cache still helps)."""
        parent = self._requests.get(request.parent_request_id or "")
        if (
            parent is None
            or parent.status not in (RequestStatus.WAITING, RequestStatus.RUNNING)
            or request.num_output_tokens > 0
            or request.sampling_params.prompt_logprobs is not None
            or parent.prompt_token_ids != request.prompt_token_ids
        ):
            return None
        return parent

    def _num_new_tokens(
        self, request: Request, num_computed: int, plan: SpecPlan, budget: int
    ) -> tuple[int, int]:
        """(tokens to compute, draft slots to reserve) within the budget."""
        num_left = request.num_tokens - num_computed
        num_new = min(num_left, budget)
        if num_left != 1 or plan.get(request.request_id, 0) <= 0:
            return num_new, 0
        # The step emits up to num_draft_tokens + 1 tokens: keep them within max_tokens and the context
        # (num_remaining_output_tokens already counts both limits).
        num_draft_tokens = min(
            plan[request.request_id], budget - 1, request.num_remaining_output_tokens - 1
        )
        return num_new, max(num_draft_tokens, 0)

    def _preempt(self, request: Request, step: _Step) -> None:
        self.running.remove(request)
        self.block_manager.free(request)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)
        step.preempted.append(request)

    # ---- update --------------------------------------------------------------------------
    def update(self, scheduler_output: SchedulerOutput, model_output: ModelOutput) -> list[Request]:
        """Apply a step's results; return the requests that got tokens or finished (including
        requests finished inside schedule(), e.g. too big for the whole KV cache)."""
        changed, self._finished_in_schedule = self._finished_in_schedule, []
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            if self._requests.get(request.request_id) is not request:
                continue  # aborted or finished between schedule() and update()
            step_output = model_output.outputs.get(request.request_id)
            error = scheduled.check(step_output)
            if error is not None:
                self._finish(request, RequestStatus.FINISHED_ERROR, error)
                changed.append(request)
            elif self._apply(scheduled, step_output):
                changed.append(request)
        return changed

    def _apply(self, scheduled: ScheduledRequest, step_output: RequestStepOutput | None) -> bool:
        request = scheduled.request
        computed = scheduled.start + scheduled.num_new_tokens - scheduled.num_draft_tokens
        self.num_prompt_tokens_computed_total += max(
            0, min(computed, request.num_prompt_tokens) - scheduled.start
        )
        token_ids = step_output.token_ids if step_output is not None else ()
        if not token_ids:  # mid-prefill chunk (or nothing sampled: feed the last token again)
            request.num_computed_tokens = min(computed, request.num_tokens - 1)
            self.block_manager.cache_full_blocks(request)
            return False
        status = request.append_until_stop(token_ids)
        # Accepted drafts' K/V is valid: a chain rollback is just this length (DESIGN §4).
        request.num_computed_tokens = request.num_tokens - 1
        if request.first_token_time is None and request.num_output_tokens > 0:
            request.first_token_time = time.monotonic()
        if status is not None:
            self._finish(request, status, request.error)
        else:
            self.block_manager.trim(request, request.num_computed_tokens + 1)
            self.block_manager.cache_full_blocks(request)
        return True

    # ---- finishing -----------------------------------------------------------------------
    def _finish(self, request: Request, status: RequestStatus, error: str | None = None) -> None:
        """The one freeing path of a finished request (abort, stop, length, error): its blocks
        go back to the pool and the scheduler forgets it; everything else the engine kept
        about it lives on the request and ends with it."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.block_manager.free(request)
        del self._requests[request.request_id]
        request.status = status
        request.error = error

    def _finish_in_schedule(self, request: Request, error: str) -> None:
        self._finish(request, RequestStatus.FINISHED_ERROR, error)
        self._finished_in_schedule.append(request)

    def _fits_cache(self, request: Request) -> bool:
        blocks = self.block_manager
        return blocks.num_blocks_for(request.num_tokens) <= blocks.num_total_blocks

    def _too_big_message(self, request: Request) -> str:
        blocks = self.block_manager
        return (
            f"request needs more KV cache than exists: {request.num_tokens} tokens need "
            f"{blocks.num_blocks_for(request.num_tokens)} blocks of {blocks.block_size} "
            f"tokens, the cache has {blocks.num_total_blocks}; shorten the prompt or max_tokens, "
            f"or give the server more KV cache memory"
        )


def _has_computed_prompt(parent: Request, child: Request) -> bool:
    return (
        parent.status is RequestStatus.RUNNING
        and parent.num_computed_tokens >= child.num_prompt_tokens
    )
