"""Factories and a fake model for scheduler / block manager tests (no torch, milliseconds).

FakeModel plays the target model: the "true" continuation of a request is a fixed function of
its id and output position, so a request that is preempted and recomputed must still produce
exactly the same tokens, and speculation (accepting a random number of the reserved draft slots)
must not change them either.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter, deque
from collections.abc import Callable, Sequence

from engine.config import CacheConfig, SchedulerConfig
from engine.core.block_manager import BlockManager
from engine.core.scheduler import Scheduler, _Step
from engine.outputs import ModelOutput, RequestStepOutput, SchedulerOutput, SpecPlan
from engine.request import Request
from engine.sampling_params import SamplingParams


def make_requests(
    num_requests: int = 1,
    prompt_len: int = 8,
    *,
    prefix: Sequence[int] = (),
    id_prefix: str = "r",
    eos_token_id: int | None = None,
    max_total_tokens: int = 1 << 30,
    **sampling: object,
) -> list[Request]:
    """Requests with distinct prompts (after an optional shared `prefix`), greedy params."""
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 16, **sampling})
    return [
        Request(
            request_id=f"{id_prefix}{i}",
            prompt_token_ids=list(prefix) + [10_000 * (i + 1) + j for j in range(prompt_len)],
            sampling_params=params,
            eos_token_ids=() if eos_token_id is None else (eos_token_id,),
            max_total_tokens=max_total_tokens,
            arrival_time=float(i),
        )
        for i in range(num_requests)
    ]


def make_scheduler(
    num_blocks: int = 64,
    block_size: int = 16,
    max_num_batched_tokens: int = 64,
    max_num_seqs: int = 8,
    enable_prefix_caching: bool = True,
) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs),
        CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching),
        num_blocks,
    )


def true_token(request: Request, output_index: int) -> int:
    """The fake model's deterministic output token (never below 3000, so never a small EOS)."""
    return 3000 + zlib.crc32(f"{request.request_id}:{output_index}".encode()) % 1000


class FakeModel:
    """Builds ModelOutputs by hand: samples where the scheduler asks for it and accepts a random
    number of the reserved draft slots (`accept` can fix that number per request)."""

    def __init__(self, seed: int = 0, accept: Callable[[Request, int], int] | None = None) -> None:
        self.rng = random.Random(seed)
        self.accept = accept

    def execute(self, scheduler_output: SchedulerOutput) -> ModelOutput:
        outputs = {}
        for scheduled in scheduler_output.scheduled:
            request = scheduled.request
            if not scheduled.needs_sample:
                outputs[request.request_id] = RequestStepOutput(request.request_id, ())
                continue
            k = scheduled.num_draft_tokens
            accepted = self.accept(request, k) if self.accept else self.rng.randint(0, k)
            first = request.num_output_tokens
            token_ids = tuple(true_token(request, first + i) for i in range(accepted + 1))
            outputs[request.request_id] = RequestStepOutput(
                request.request_id, token_ids, num_draft_tokens=k, num_accepted_tokens=accepted
            )
        return ModelOutput(outputs=outputs)


def preempt(scheduler: Scheduler, request: Request) -> None:
    """Preempt a running request between steps, as a full cache would (white-box helper)."""
    scheduler._preempt(request, _Step(budget=0))


def check_block_invariants(scheduler: Scheduler) -> None:
    """Ref counts equal the number of live holders, free lists are exact and duplicate-free,
    waiting requests hold nothing, and running requests hold their computed tokens' blocks."""
    blocks: BlockManager = scheduler.block_manager
    holders: Counter[int] = Counter()
    for request in scheduler.running:
        assert len(set(request.block_ids)) == len(request.block_ids), request.block_ids
        assert len(request.block_ids) >= blocks.num_blocks_for(request.num_computed_tokens)
        assert request.num_computed_tokens <= request.num_tokens - 1
        holders.update(request.block_ids)
    for request in scheduler.waiting:
        assert request.block_ids == [], f"waiting {request.request_id} holds blocks"
    for block_id in range(blocks.num_total_blocks):
        assert blocks.ref_count(block_id) == holders[block_id], f"block {block_id}"
    free = blocks.free_block_ids()
    assert len(free) == len(set(free)) == blocks.num_free_blocks
    assert set(free) == {b for b in range(blocks.num_total_blocks) if holders[b] == 0}


def check_step(scheduler: Scheduler, scheduler_output: SchedulerOutput) -> None:
    """A step stays within its budget, and never re-admits what it just preempted (thrash)."""
    scheduled_ids = {s.request_id for s in scheduler_output.scheduled}
    assert len(scheduled_ids) == len(scheduler_output.scheduled)
    assert not scheduled_ids & set(scheduler_output.preempted_ids)
    assert scheduler_output.num_batched_tokens <= scheduler.config.max_num_batched_tokens
    assert len(scheduler.running) <= scheduler.config.max_num_seqs


def run_to_completion(
    scheduler: Scheduler,
    model: FakeModel,
    plan_fn: Callable[[Scheduler], SpecPlan] | None = None,
    max_steps: int = 10_000,
) -> dict[str, Request]:
    """Step until no request is left, checking invariants each step; returns finished ones."""
    finished: dict[str, Request] = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return finished
        plan = plan_fn(scheduler) if plan_fn else {}
        scheduler_output = scheduler.schedule(plan)
        check_block_invariants(scheduler)
        check_step(scheduler, scheduler_output)
        for request in scheduler.update(scheduler_output, model.execute(scheduler_output)):
            if request.is_finished:
                finished[request.request_id] = request
        check_block_invariants(scheduler)
    raise AssertionError(f"requests still unfinished after {max_steps} steps")


def expected_output(request: Request, num_tokens: int) -> list[int]:
    return [true_token(request, i) for i in range(num_tokens)]


def request_state_in(root: object, is_request_key: Callable[[object], bool]) -> list[str]:
    """Where `root`, or an engine object it holds, keeps per-request state outside the request:
    a Request, or a dict keyed by a request id (`is_request_key`). A finished request must
    leave nothing behind: everything the engine kept about it lives on the Request (its one
    owner). The model (engine/models) and non-engine objects are not walked."""
    found: list[str] = []
    seen: set[int] = set()

    def walk(obj: object, path: str) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, Request):
            found.append(f"{path}: a Request")
        elif isinstance(obj, dict):
            found.extend(f"{path}[{k!r}]" for k in obj if is_request_key(k))
            for key, value in obj.items():
                walk(value, f"{path}[{key!r}]")
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            for i, item in enumerate(obj):
                walk(item, f"{path}[{i}]")
        elif _is_engine_object(obj):
            for name, value in vars(obj).items():
                walk(value, f"{path}.{name}")

    walk(root, type(root).__name__)
    return found


def _is_engine_object(obj: object) -> bool:
    module = type(obj).__module__
    return (
        module.startswith("engine.")
        and not module.startswith("engine.models")
        and hasattr(obj, "__dict__")
    )
