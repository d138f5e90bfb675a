"""Scheduler: token budget, chunked prefill, seats, prefix caching, preemption, aborts and
errors, with a fake model that emits deterministic tokens (no torch, milliseconds).
Speculation and n > 1 forks are in test_scheduler_spec.py."""

from __future__ import annotations

from engine.outputs import ModelOutput, RequestStepOutput
from engine.request import RequestStatus
from tests.engine.factories import (
    FakeModel,
    check_block_invariants,
    expected_output,
    make_requests,
    make_scheduler,
    preempt,
    run_to_completion,
)


def _step(scheduler, model=None, plan=None):
    out = scheduler.schedule(plan or {})
    check_block_invariants(scheduler)
    changed = scheduler.update(out, (model or FakeModel()).execute(out))
    check_block_invariants(scheduler)
    return out, changed


def test_chunked_prefill_splits_within_budget_and_mixes_with_decodes():
    scheduler = make_scheduler(max_num_batched_tokens=32)
    short_a, short_b = make_requests(2, prompt_len=4, max_tokens=50)
    (long,) = make_requests(1, prompt_len=100, id_prefix="long")
    for request in (short_a, short_b, long):
        scheduler.add_request(request)
    out, _ = _step(scheduler)
    assert [(s.request_id, s.num_new_tokens) for s in out.scheduled] == [
        ("r0", 4),
        ("r1", 4),
        ("long0", 24),
    ]
    chunks = [24]
    while long.num_output_tokens == 0:
        out, _ = _step(scheduler)
        sizes = {s.request_id: s.num_new_tokens for s in out.scheduled}
        assert sizes["r0"] == sizes["r1"] == 1  # decodes keep going during the prefill
        assert out.num_batched_tokens <= 32
        chunks.append(sizes["long0"])
    assert chunks == [24, 30, 30, 16]
    assert sum(chunks) == 100
    assert long.num_computed_tokens == 100


def test_max_num_seqs_caps_running_requests():
    scheduler = make_scheduler(max_num_seqs=3, max_num_batched_tokens=512)
    for request in make_requests(5, prompt_len=4, max_tokens=3):
        scheduler.add_request(request)
    out, _ = _step(scheduler)
    assert len(out.scheduled) == 3
    assert (scheduler.num_running, scheduler.num_waiting) == (3, 2)
    finished = run_to_completion(scheduler, FakeModel())
    assert len(finished) == 5


def test_every_request_completes_under_a_tiny_pool_with_preemption():
    scheduler = make_scheduler(num_blocks=12, block_size=8, max_num_batched_tokens=32)
    requests = make_requests(6, prompt_len=20, max_tokens=24)  # 6 blocks each, 2 fit at once
    for request in requests:
        scheduler.add_request(request)
    finished = run_to_completion(scheduler, FakeModel())
    assert scheduler.num_preemptions_total > 0
    assert any(r.num_preemptions > 0 for r in requests)
    for request in requests:
        assert finished[request.request_id].status is RequestStatus.FINISHED_LENGTH
        assert request.output_token_ids == expected_output(request, 24)  # recompute is exact
    assert scheduler.block_manager.num_free_blocks == 12


def test_preempted_request_goes_to_the_front_and_resumes():
    # Two requests of up to 40 tokens (5 blocks each) share 6 blocks; a third waits for a seat.
    scheduler = make_scheduler(num_blocks=6, block_size=8, max_num_seqs=2)
    first, second, third = make_requests(3, prompt_len=16, max_tokens=24)
    for request in (first, second, third):
        scheduler.add_request(request)
    preempted: list[str] = []
    while not preempted:
        out, _ = _step(scheduler)
        preempted = list(out.preempted_ids)
    assert preempted == ["r1"]  # the latest arrival among the running
    assert second.status is RequestStatus.PREEMPTED and second.block_ids == []
    assert second.num_computed_tokens == 0 and second.num_preemptions == 1
    assert [r.request_id for r in scheduler.waiting] == ["r1", "r2"]
    finished = run_to_completion(scheduler, FakeModel())
    assert second.output_token_ids == expected_output(second, 24)
    assert set(finished) == {"r0", "r1", "r2"}
    assert scheduler.block_manager.num_free_blocks == 6


def test_a_preempted_request_is_not_readmitted_in_the_same_step():
    # A small budget makes a 1-block chunk of the preempted request fit the block it freed.
    scheduler = make_scheduler(
        num_blocks=4, block_size=8, max_num_batched_tokens=8, enable_prefix_caching=False
    )
    for request in make_requests(2, prompt_len=8, max_tokens=30):
        scheduler.add_request(request)
    finished = run_to_completion(scheduler, FakeModel())  # check_step asserts it every step
    assert scheduler.num_preemptions_total > 0 and len(finished) == 2


def test_a_request_larger_than_the_whole_cache_errors_instead_of_looping():
    scheduler = make_scheduler(num_blocks=4, block_size=8)
    (huge,) = make_requests(1, prompt_len=33, id_prefix="huge")
    (small,) = make_requests(1, prompt_len=8, max_tokens=4)
    scheduler.add_request(huge)
    scheduler.add_request(small)
    finished = run_to_completion(scheduler, FakeModel())
    assert huge.status is RequestStatus.FINISHED_ERROR
    assert "5 blocks of 8 tokens" in huge.error and "the cache has 4" in huge.error
    assert finished["r0"].status is RequestStatus.FINISHED_LENGTH
    assert "huge0" in finished  # reported through update()


def test_a_request_that_outgrows_the_cache_while_decoding_errors():
    scheduler = make_scheduler(num_blocks=3, block_size=8)
    (request,) = make_requests(1, prompt_len=12, max_tokens=40)
    scheduler.add_request(request)
    finished = run_to_completion(scheduler, FakeModel())
    assert finished["r0"].status is RequestStatus.FINISHED_ERROR
    assert request.num_computed_tokens == 24  # it filled all 3 blocks first
    assert scheduler.block_manager.num_free_blocks == 3


def test_shared_200_token_prefix_is_served_from_the_cache():
    scheduler = make_scheduler(num_blocks=64, block_size=16, max_num_batched_tokens=512)
    prefix = list(range(500, 700))
    first, second = make_requests(2, prompt_len=20, prefix=prefix, max_tokens=2)
    scheduler.add_request(first)
    run_to_completion(scheduler, FakeModel())
    computed_before = scheduler.num_prompt_tokens_computed_total
    assert computed_before == 220
    scheduler.add_request(second)
    out, _ = _step(scheduler)
    assert second.num_cached_tokens == 192  # 12 full blocks of the 200-token prefix
    assert out.scheduled[0].start == 192 and out.scheduled[0].num_new_tokens == 220 - 192
    run_to_completion(scheduler, FakeModel())
    assert scheduler.num_prompt_tokens_computed_total - computed_before == 28
    blocks = scheduler.block_manager
    assert (blocks.prefix_cache_queries, blocks.prefix_cache_hits) == (440, 192)


def test_chunks_of_a_running_prefill_are_already_shared():
    scheduler = make_scheduler(block_size=8, max_num_batched_tokens=40)
    first, second = make_requests(2, prompt_len=8, prefix=list(range(64)))
    scheduler.add_request(first)
    _step(scheduler)  # first computes 40 of its 72 tokens
    scheduler.add_request(second)
    out, _ = _step(scheduler)
    assert second.num_cached_tokens == 40 and _only(out, "r1").start == 40


def test_prompt_logprobs_requests_compute_their_whole_prompt():
    scheduler = make_scheduler(block_size=8, max_num_batched_tokens=512)
    (first,) = make_requests(1, prompt_len=8, prefix=list(range(64)))
    (second,) = make_requests(
        1, prompt_len=8, prefix=list(range(64)), prompt_logprobs=1, id_prefix="logprobs"
    )
    scheduler.add_request(first)
    _step(scheduler)
    scheduler.add_request(second)
    out, _ = _step(scheduler)
    assert second.num_cached_tokens == 0 and _only(out, "logprobs0").num_new_tokens == 72


def _only(out, request_id):
    (scheduled,) = [s for s in out.scheduled if s.request_id == request_id]
    return scheduled


def test_prefix_caching_off_recomputes_everything():
    scheduler = make_scheduler(max_num_batched_tokens=512, enable_prefix_caching=False)
    first, second = make_requests(2, prompt_len=4, prefix=list(range(64)), max_tokens=2)
    scheduler.add_request(first)
    run_to_completion(scheduler, FakeModel())
    scheduler.add_request(second)
    _step(scheduler)
    assert second.num_cached_tokens == 0
    assert scheduler.num_prompt_tokens_computed_total == 136


def test_preempted_request_resumes_from_its_own_cached_blocks():
    scheduler = make_scheduler(num_blocks=64, block_size=8, max_num_batched_tokens=64)
    (request,) = make_requests(1, prompt_len=20, max_tokens=20)
    scheduler.add_request(request)
    for _ in range(5):
        _step(scheduler)
    preempt(scheduler, request)
    _step(scheduler)
    assert request.num_cached_tokens == 24  # 24 of its 25 tokens sit in full cached blocks


def test_abort_in_every_state_frees_everything():
    scheduler = make_scheduler(num_blocks=10, block_size=8, max_num_batched_tokens=16)
    decoding, prefilling, waiting = make_requests(3, prompt_len=24, max_tokens=30)
    for request in (decoding, prefilling, waiting):
        scheduler.add_request(request)
    while decoding.num_output_tokens == 0:
        _step(scheduler)
    mid_prefill = prefilling.num_computed_tokens < prefilling.num_tokens - 1
    assert mid_prefill and prefilling.block_ids  # holding blocks
    assert waiting.status is RequestStatus.WAITING
    preempt(scheduler, prefilling)
    aborted = scheduler.abort_requests(["r1", "r2", "unknown"])
    assert [r.request_id for r in aborted] == ["r1", "r2"]
    assert all(r.status is RequestStatus.FINISHED_ABORTED for r in aborted)
    check_block_invariants(scheduler)
    out = scheduler.schedule({})
    scheduler.abort_requests(["r0"])  # between schedule and update
    assert scheduler.update(out, FakeModel().execute(out)) == []
    assert scheduler.abort_requests(["r0"]) == []  # already finished: freed exactly once
    assert scheduler.block_manager.num_free_blocks == 10
    assert not scheduler.has_unfinished_requests()


def test_model_error_finishes_only_that_request():
    scheduler = make_scheduler()
    bad, good = make_requests(2, prompt_len=4)
    scheduler.add_request(bad)
    scheduler.add_request(good)
    out = scheduler.schedule({})
    model_output = FakeModel().execute(out)
    outputs = dict(model_output.outputs)
    outputs["r0"] = RequestStepOutput("r0", (), error="boom")
    changed = scheduler.update(out, ModelOutput(outputs=outputs))
    assert {r.request_id for r in changed} == {"r0", "r1"}
    assert bad.status is RequestStatus.FINISHED_ERROR and bad.error == "boom"
    assert good.status is RequestStatus.RUNNING and good.num_output_tokens == 1
    assert good.first_token_time is not None and bad.block_ids == []


def test_eos_and_stop_token_ids_finish_as_stopped():
    scheduler = make_scheduler()
    (eos_request,) = make_requests(1, prompt_len=4, eos_token_id=2, id_prefix="eos")
    (stop_request,) = make_requests(1, prompt_len=4, stop_token_ids=(7,), id_prefix="stop")
    scheduler.add_request(eos_request)
    scheduler.add_request(stop_request)
    out = scheduler.schedule({})
    changed = scheduler.update(out, _emit(out, {"eos0": (2,), "stop0": (5,)}))
    assert [r.request_id for r in changed] == ["eos0", "stop0"]
    assert eos_request.status is RequestStatus.FINISHED_STOPPED
    assert eos_request.output_token_ids == [2]
    assert stop_request.status is RequestStatus.RUNNING
    out = scheduler.schedule({})
    scheduler.update(out, _emit(out, {"stop0": (7,)}))
    assert stop_request.status is RequestStatus.FINISHED_STOPPED
    assert stop_request.output_token_ids == [5, 7]
    assert scheduler.block_manager.num_free_blocks == 64


def _emit(out, tokens_by_id):
    return ModelOutput(
        outputs={
            s.request_id: RequestStepOutput(s.request_id, tuple(tokens_by_id.get(s.request_id, ())))
            for s in out.scheduled
        }
    )


def test_min_tokens_and_ignore_eos_defer_eos():
    scheduler = make_scheduler()
    (early,) = make_requests(1, prompt_len=4, eos_token_id=2, min_tokens=2, max_tokens=9)
    (ignoring,) = make_requests(1, prompt_len=4, eos_token_id=2, ignore_eos=True, id_prefix="i")
    scheduler.add_request(early)
    scheduler.add_request(ignoring)
    out = scheduler.schedule({})
    scheduler.update(out, _emit(out, {"r0": (2,), "i0": (2,)}))
    assert early.status is RequestStatus.RUNNING  # EOS before min_tokens does not stop
    out = scheduler.schedule({})
    scheduler.update(out, _emit(out, {"r0": (2,), "i0": (2,)}))
    assert early.status is RequestStatus.FINISHED_STOPPED and early.num_output_tokens == 2
    assert ignoring.status is RequestStatus.RUNNING


def test_max_tokens_zero_and_context_length_cap():
    scheduler = make_scheduler()
    (zero,) = make_requests(1, prompt_len=4, max_tokens=0)
    (capped,) = make_requests(1, prompt_len=4, max_tokens=None, max_total_tokens=6, id_prefix="c")
    scheduler.add_request(zero)
    scheduler.add_request(capped)
    finished = run_to_completion(scheduler, FakeModel())
    assert finished["r0"].status is RequestStatus.FINISHED_LENGTH and zero.output_token_ids == []
    assert finished["c0"].status is RequestStatus.FINISHED_LENGTH and capped.num_tokens == 6


def test_finish_request_frees_blocks():
    scheduler = make_scheduler()
    (request,) = make_requests(1, prompt_len=20)
    scheduler.add_request(request)
    _step(scheduler)
    assert scheduler.finish_request("r0", RequestStatus.FINISHED_STOPPED) is request
    assert scheduler.finish_request("r0", RequestStatus.FINISHED_STOPPED) is None
    assert request.block_ids == [] and scheduler.block_manager.num_free_blocks == 64
    assert not scheduler.has_unfinished_requests()
