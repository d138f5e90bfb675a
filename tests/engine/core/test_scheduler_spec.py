"""Scheduler with speculation (reserved draft slots, rollback, truncation), n > 1 forks with
copy-on-write, and a 1,000-step random run that must leak no block."""

from __future__ import annotations

import random

from engine.outputs import (
    BlockCopy,
    ModelOutput,
    RequestStepOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.request import Request, RequestStatus
from engine.sampling_params import SamplingParams
from tests.engine.factories import (
    FakeModel,
    check_block_invariants,
    check_step,
    expected_output,
    make_requests,
    make_scheduler,
    run_to_completion,
)


def _prefilled(scheduler, request):
    """Add the request and run its prefill (one token out): it is then caught up."""
    scheduler.add_request(request)
    out = scheduler.schedule({})
    scheduler.update(out, FakeModel().execute(out))
    assert request.num_computed_tokens == request.num_tokens - 1


def _only(out, request_id):
    (scheduled,) = [s for s in out.scheduled if s.request_id == request_id]
    return scheduled


def test_plan_reserves_one_plus_k_slots():
    scheduler = make_scheduler()
    (request,) = make_requests(1, prompt_len=10, max_tokens=50)
    _prefilled(scheduler, request)
    out = scheduler.schedule({"r0": 4})
    scheduled = _only(out, "r0")
    assert (scheduled.num_new_tokens, scheduled.num_draft_tokens, scheduled.start) == (5, 4, 10)
    assert scheduled.needs_sample and out.num_batched_tokens == 5
    assert len(request.block_ids) == 1  # positions 10..14 fit in block 0


def test_draft_slots_are_capped_by_budget_max_tokens_and_context():
    scheduler = make_scheduler(max_num_batched_tokens=3)
    budget, outputs, context = (
        make_requests(1, prompt_len=2, max_tokens=50, id_prefix="b")[0],
        make_requests(1, prompt_len=2, max_tokens=3, id_prefix="o")[0],
        make_requests(1, prompt_len=2, max_tokens=None, max_total_tokens=5, id_prefix="c")[0],
    )
    for request in (budget, outputs, context):
        _prefilled(scheduler, request)
        out = scheduler.schedule({request.request_id: 8})
        scheduler.update(out, ModelOutput(outputs={}))  # nothing sampled: back to caught up
        assert request.num_computed_tokens == request.num_tokens - 1
        scheduler.finish_request(request.request_id, RequestStatus.FINISHED_ABORTED)
        k = _only(out, request.request_id).num_draft_tokens
        # budget 3 -> k 2; 2 outputs left -> k 1; context 5 with 3 tokens -> k 1
        assert k == {"b0": 2, "o0": 1, "c0": 1}[request.request_id]


def test_prefill_chunks_get_no_draft_slots():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    (request,) = make_requests(1, prompt_len=20)
    scheduler.add_request(request)
    out = scheduler.schedule({"r0": 4})
    assert (_only(out, "r0").num_new_tokens, _only(out, "r0").num_draft_tokens) == (8, 0)


def test_rejected_drafts_roll_back_and_free_their_blocks():
    scheduler = make_scheduler(block_size=8)
    (request,) = make_requests(1, prompt_len=6, max_tokens=50)
    _prefilled(scheduler, request)  # 7 tokens, 6 computed
    free_before = scheduler.block_manager.num_free_blocks
    out = scheduler.schedule({"r0": 12})  # writes positions 6..18: blocks 0, 1, 2
    assert len(request.block_ids) == 3
    scheduler.update(out, FakeModel(accept=lambda r, k: 1).execute(out))
    assert request.output_token_ids == expected_output(request, 3)
    assert request.num_computed_tokens == 8  # fed token + 1 accepted draft
    assert len(request.block_ids) == 2  # block 2 held only rejected drafts
    assert scheduler.block_manager.num_free_blocks == free_before - 1
    assert scheduler.block_manager.num_cached_blocks == 1  # block 0 only: fully verified
    check_block_invariants(scheduler)


def test_blocks_holding_drafts_are_never_hashed():
    scheduler = make_scheduler(block_size=8)
    (request,) = make_requests(1, prompt_len=6, max_tokens=50)
    _prefilled(scheduler, request)
    out = scheduler.schedule({"r0": 12})
    scheduler.update(out, FakeModel(accept=lambda r, k: 0).execute(out))
    assert scheduler.block_manager.num_cached_blocks == 0  # 7 verified tokens: no full block
    out = scheduler.schedule({"r0": 12})
    scheduler.update(out, FakeModel(accept=lambda r, k: k).execute(out))
    assert request.num_computed_tokens == 20
    assert scheduler.block_manager.num_cached_blocks == 2


def test_stop_token_among_accepted_tokens_truncates():
    scheduler = make_scheduler()
    (request,) = make_requests(1, prompt_len=4, max_tokens=50, stop_token_ids=(7,))
    _prefilled(scheduler, request)
    out = scheduler.schedule({"r0": 4})
    step = RequestStepOutput("r0", (5, 7, 9, 11, 13), num_draft_tokens=4, num_accepted_tokens=4)
    changed = scheduler.update(out, ModelOutput(outputs={"r0": step}))
    assert changed == [request]
    assert request.output_token_ids[-2:] == [5, 7] and request.num_output_tokens == 3
    assert request.status is RequestStatus.FINISHED_STOPPED
    assert request.block_ids == [] and scheduler.block_manager.num_free_blocks == 64


def test_max_tokens_truncates_extra_accepted_tokens():
    scheduler = make_scheduler()
    (request,) = make_requests(1, prompt_len=4, max_tokens=3)
    _prefilled(scheduler, request)
    # A step reserved before max_tokens was known to bind (built by hand): 1 + 4 slots.
    scheduled = ScheduledRequest(request, num_new_tokens=5, num_draft_tokens=4, start=4)
    step = RequestStepOutput("r0", (5, 6, 7, 8, 9), num_draft_tokens=4, num_accepted_tokens=4)
    scheduler.update(SchedulerOutput((scheduled,)), ModelOutput(outputs={"r0": step}))
    assert request.num_output_tokens == 3 and request.output_token_ids[1:] == [5, 6]
    assert request.status is RequestStatus.FINISHED_LENGTH


def test_runner_returning_too_many_tokens_is_an_error_not_corruption():
    scheduler = make_scheduler()
    (request,) = make_requests(1, prompt_len=4, max_tokens=30)
    _prefilled(scheduler, request)
    out = scheduler.schedule({"r0": 1})
    step = RequestStepOutput("r0", (5, 6, 7))  # 2 slots, 3 tokens
    scheduler.update(out, ModelOutput(outputs={"r0": step}))
    assert request.status is RequestStatus.FINISHED_ERROR and "3 tokens" in request.error


def test_drafts_are_dropped_before_anyone_is_preempted():
    scheduler = make_scheduler(num_blocks=3, block_size=8)
    first, second = make_requests(2, prompt_len=7, max_tokens=50)
    _prefilled(scheduler, first)
    _prefilled(scheduler, second)
    out = scheduler.schedule({"r0": 12})  # would need 2 more blocks, 1 is free
    assert out.preempted_ids == ()
    assert (_only(out, "r0").num_new_tokens, _only(out, "r0").num_draft_tokens) == (1, 0)


def _family(prompt_len: int, n: int) -> list[Request]:
    params = SamplingParams(temperature=1.0, max_tokens=6, n=n)
    prompt = list(range(100, 100 + prompt_len))
    return [
        Request(f"g-{i}", list(prompt), params, parent_request_id=None if i == 0 else "g-0")
        for i in range(n)
    ]


def test_children_fork_the_parent_prompt_with_copy_on_write():
    scheduler = make_scheduler(block_size=8)
    parent, child_a, child_b = _family(prompt_len=20, n=3)  # blocks: 8 + 8 + 4 tokens
    for request in (parent, child_a, child_b):
        scheduler.add_request(request)
    out = scheduler.schedule({})
    assert [s.request_id for s in out.scheduled] == ["g-0"]  # children wait for the prompt
    scheduler.update(out, FakeModel().execute(out))
    out = scheduler.schedule({})
    check_block_invariants(scheduler)
    assert [(s.request_id, s.start, s.num_new_tokens) for s in out.scheduled] == [
        ("g-0", 20, 1),
        ("g-1", 19, 1),  # only the last prompt token is recomputed, to sample
        ("g-2", 19, 1),
    ]
    shared_full, partial = parent.block_ids[:2], parent.block_ids[2]
    assert child_a.block_ids[:2] == child_b.block_ids[:2] == shared_full
    assert out.block_copies == (
        BlockCopy(partial, child_a.block_ids[2]),
        BlockCopy(partial, child_b.block_ids[2]),
    )
    assert [scheduler.block_manager.ref_count(b) for b in shared_full] == [3, 3]
    assert scheduler.block_manager.ref_count(partial) == 1
    assert child_a.num_cached_tokens == 19
    scheduler.update(out, FakeModel().execute(out))
    assert child_a.output_token_ids == expected_output(child_a, 1)
    assert scheduler.num_prompt_tokens_computed_total == 22
    run_to_completion(scheduler, FakeModel())
    assert scheduler.block_manager.num_free_blocks == 64


def test_child_prefills_itself_when_the_parent_is_gone():
    scheduler = make_scheduler(block_size=8)
    parent, child = _family(prompt_len=20, n=2)
    scheduler.add_request(parent)
    scheduler.add_request(child)
    out = scheduler.schedule({})
    scheduler.update(out, FakeModel().execute(out))
    scheduler.abort_requests(["g-0"])
    out = scheduler.schedule({})
    assert [(s.request_id, s.start, s.num_new_tokens) for s in out.scheduled] == [("g-1", 16, 4)]
    assert child.num_cached_tokens == 16  # the parent's freed full blocks, via the prefix cache
    assert out.block_copies == ()


def test_abort_a_child_waiting_for_its_parent():
    scheduler = make_scheduler(max_num_batched_tokens=8)
    parent, child = _family(prompt_len=20, n=2)
    scheduler.add_request(parent)
    scheduler.add_request(child)
    out = scheduler.schedule({})
    scheduler.update(out, FakeModel().execute(out))  # parent mid-prefill, child waiting
    assert scheduler.abort_requests(["g-1"]) == [child]
    assert child.block_ids == [] and scheduler.num_waiting == 0
    run_to_completion(scheduler, FakeModel())
    assert parent.status is RequestStatus.FINISHED_LENGTH
    assert scheduler.block_manager.num_free_blocks == 64


def _random_request(rng: random.Random, index: int, shared: list[int]) -> list[Request]:
    params = SamplingParams(
        temperature=0.0, max_tokens=rng.randint(1, 30), n=1 if rng.random() < 0.8 else 2
    )
    prompt = shared[: rng.randint(0, len(shared))] + [
        rng.randint(5, 50) for _ in range(rng.randint(1, 20))
    ]
    ids = [f"q{index}-{i}" for i in range(params.n)]
    return [
        Request(child_id, list(prompt), params, parent_request_id=None if i == 0 else ids[0])
        for i, child_id in enumerate(ids)
    ]


def test_a_thousand_random_speculative_steps_leak_nothing():
    rng = random.Random(7)
    scheduler = make_scheduler(
        num_blocks=24, block_size=8, max_num_batched_tokens=40, max_num_seqs=6
    )
    model = FakeModel(seed=11)
    shared = [rng.randint(5, 50) for _ in range(40)]
    finished: dict[str, Request] = {}
    for index in range(1000):
        if rng.random() < 0.3:
            for request in _random_request(rng, index, shared):
                scheduler.add_request(request)
        if rng.random() < 0.03 and scheduler.running:
            scheduler.abort_requests([rng.choice(scheduler.running).request_id])
        plan = {r.request_id: rng.randint(0, 6) for r in scheduler.running}
        out = scheduler.schedule(plan)
        check_block_invariants(scheduler)
        check_step(scheduler, out)
        for request in scheduler.update(out, model.execute(out)):
            finished[request.request_id] = request
        check_block_invariants(scheduler)
    finished.update(run_to_completion(scheduler, model))
    assert scheduler.num_preemptions_total > 0 and scheduler.block_manager.num_cached_blocks > 0
    for request in finished.values():
        if request.status is RequestStatus.FINISHED_LENGTH:
            assert request.output_token_ids == expected_output(
                request, request.sampling_params.max_tokens
            )
    assert scheduler.block_manager.num_free_blocks == 24
    assert not scheduler.has_unfinished_requests()
