"""execute_isolating: a step that raises is re-run in halves until the failing requests are
found; they fail with their error, every other request gets its output once (no model)."""

from __future__ import annotations

import logging

import pytest

from engine.outputs import BlockCopy, Drafts, ModelOutput, ScheduledRequest, SchedulerOutput
from engine.request import RequestStatus
from engine.runner.step_isolation import execute_isolating
from tests.engine.factories import (
    FakeModel,
    check_block_invariants,
    expected_output,
    make_requests,
    make_scheduler,
)


class FaultyRunner:
    """FakeModel's outputs, but any step holding a poisoned request raises."""

    def __init__(self, poisoned: set[str]) -> None:
        self.model = FakeModel(accept=lambda request, k: k)
        self.poisoned = poisoned
        self.steps: list[SchedulerOutput] = []

    def execute(self, sched: SchedulerOutput, drafts: Drafts) -> ModelOutput:
        self.steps.append(sched)
        ids = {s.request_id for s in sched.scheduled}
        if ids & self.poisoned:
            raise RuntimeError(f"poisoned: {sorted(ids & self.poisoned)}")
        return self.model.execute(sched)


def run_isolating(scheduler, runner, max_steps: int = 1000) -> dict:
    finished = {}
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return finished
        sched = scheduler.schedule({})
        if sched.is_empty:
            continue
        for request in scheduler.update(sched, execute_isolating(runner, sched, Drafts())):
            if request.is_finished:
                finished[request.request_id] = request
        check_block_invariants(scheduler)
    raise AssertionError("requests still unfinished")


@pytest.mark.parametrize("poisoned", [{"r3"}, {"r0", "r5"}, {f"r{i}" for i in range(8)}])
def test_only_the_poisoned_requests_fail_and_the_others_lose_no_token(poisoned):
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=256)
    requests = make_requests(8, prompt_len=5, max_tokens=6)
    for request in requests:
        scheduler.add_request(request)
    runner = FaultyRunner(poisoned)
    finished = run_isolating(scheduler, runner)
    assert set(finished) == {r.request_id for r in requests}
    for request in requests:
        if request.request_id in poisoned:
            assert request.status is RequestStatus.FINISHED_ERROR
            assert "poisoned" in request.error and request.output_token_ids == []
        else:
            assert request.status is RequestStatus.FINISHED_LENGTH
            assert request.output_token_ids == expected_output(request, 6)
    assert scheduler.block_manager.num_free_blocks == 64


def test_bisection_costs_a_few_runs_per_fault(caplog):
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=256, max_num_seqs=16)
    for request in make_requests(16, prompt_len=3, max_tokens=1):
        scheduler.add_request(request)
    runner = FaultyRunner({"r11"})
    sched = scheduler.schedule({})
    with caplog.at_level(logging.INFO):
        out = execute_isolating(runner, sched, Drafts())
    assert len(out.outputs) == 16 and out.outputs["r11"].error is not None
    (line,) = [r for r in caplog.records if r.levelno >= logging.INFO]  # one line per step
    assert "16 requests failed" in line.getMessage() and "1 failed: r11" in line.getMessage()
    # 1 full run, then two halves per level of a 16-wide binary search.
    assert len(runner.steps) == 1 + 2 * 4
    assert sorted(len(s.scheduled) for s in runner.steps[1:]) == [1, 1, 2, 2, 4, 4, 8, 8]


def test_a_fault_that_needs_the_whole_batch_fails_nobody():
    scheduler = make_scheduler()
    for request in make_requests(4, prompt_len=3, max_tokens=1):
        scheduler.add_request(request)
    model = FakeModel()

    class BigBatchFails:
        def execute(self, sched, drafts):
            if len(sched.scheduled) == 4:
                raise MemoryError("out of memory")
            return model.execute(sched)

    out = execute_isolating(BigBatchFails(), scheduler.schedule({}), Drafts())
    assert all(o.error is None and len(o.token_ids) == 1 for o in out.outputs.values())


def test_sub_steps_carry_only_their_own_block_copies_and_drafts():
    requests = make_requests(2, prompt_len=3)
    requests[0].block_ids, requests[1].block_ids = [0, 7], [1, 8]
    sched = SchedulerOutput(
        scheduled=tuple(ScheduledRequest(r, 3) for r in requests),
        block_copies=(BlockCopy(5, 7), BlockCopy(6, 8)),
        num_batched_tokens=6,
    )
    drafts = Drafts(chains={"r0": [1, 2], "r1": [3]}, target_topk=8)
    seen = []

    class Recorder:
        def execute(self, sub, sub_drafts):
            seen.append((sub, sub_drafts))
            if len(sub.scheduled) == 2:
                raise RuntimeError("fail the batch")
            return ModelOutput(outputs={})

    execute_isolating(Recorder(), sched, drafts)
    (_, _), (first, first_drafts), (second, second_drafts) = seen
    assert first.block_copies == (BlockCopy(5, 7),) and first_drafts.chains == {"r0": [1, 2]}
    assert second.block_copies == (BlockCopy(6, 8),) and second_drafts.chains == {"r1": [3]}
    assert first_drafts.target_topk == second_drafts.target_topk == 8
    assert first.num_batched_tokens == 3
