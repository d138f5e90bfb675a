"""No request can fail another (issue 16): a fault planted in one request's part of a step
fails that request only, and every other request emits exactly the tokens it emits in a run
without the faulty one, with and without speculation, greedy and seeded-sampled alike."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.e2e.test_engine_tiny import assert_pool_restored, prompts

NORMAL = [
    SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=0.8, seed=3, ignore_eos=True),
    SamplingParams(max_tokens=14, temperature=0, ignore_eos=True),
    SamplingParams(max_tokens=16, temperature=1.0, top_k=20, seed=11, ignore_eos=True, n=2),
]
# The faulty request is told apart by its max_tokens (no normal request uses 13).
FAULTY = SamplingParams(max_tokens=13, temperature=0, ignore_eos=True)
FAULT_AFTER = 3  # output tokens the faulty request gets before its fault shows


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    """proposer -> (LLM, outputs of the normal requests run without the faulty one)."""
    cache = {}

    def get(proposer: str):
        if proposer not in cache:
            flat = dict(model=str(tiny_model_dir), num_kv_blocks=128, proposer=proposer)
            if proposer != "none":
                flat.update(spec_policy="fixed:3", num_speculative_tokens=3)
            llm = LLM(config=EngineConfig.from_flat(flat))
            cache[proposer] = llm, run(llm, with_faulty=False)
        return cache[proposer]

    return get


def normal_prompts() -> list[list[int]]:
    # Repetitive prompts, so that the n-gram proposer finds drafts.
    return [p * 3 for p in prompts(len(NORMAL), seed=5, low=4, high=8)]


def faulty_requests(model_input) -> list:
    return [
        rows
        for rows in model_input.requests
        if rows.scheduled.request.sampling_params.max_tokens == FAULTY.max_tokens
        and rows.scheduled.request.num_output_tokens >= FAULT_AFTER
    ]


def run(llm: LLM, with_faulty: bool) -> list:
    batch = normal_prompts()
    params = list(NORMAL)
    if with_faulty:
        batch.insert(2, prompts(1, seed=9, low=30, high=31)[0])
        params.insert(2, FAULTY)
    outputs = llm.generate(batch, params, use_tqdm=False)
    assert_pool_restored(llm)
    return outputs


def check_isolated(clean: list, faulty: list, message: str) -> None:
    bad = [o for o in faulty if o.finish_reason == "error"]
    assert len(bad) == 1 and message in bad[0].error
    assert FAULT_AFTER <= len(bad[0].output_token_ids) < FAULTY.max_tokens
    others = [o for o in faulty if o.finish_reason != "error"]
    assert [o.output_token_ids for o in others] == [o.output_token_ids for o in clean]
    assert [o.finish_reason for o in others] == ["length"] * len(clean)


@pytest.mark.parametrize("proposer", ["none", "ngram"])
def test_a_step_that_raises_fails_only_the_request_that_makes_it_raise(
    engines, proposer, monkeypatch
):
    llm, clean = engines(proposer)
    runner = llm.engine.runner
    forward = runner._logits
    calls = []

    def planted(model_input):
        calls.append(len(model_input.requests))
        if faulty_requests(model_input):  # raises after the others' K/V was written
            forward(model_input)
            raise RuntimeError("injected fault")
        return forward(model_input)

    monkeypatch.setattr(runner, "_logits", planted)
    check_isolated(clean, run(llm, with_faulty=True), "injected fault")
    assert max(calls) > 1 and 1 in calls  # batched steps, and the bisection reached one
    if proposer != "none":  # the faulty steps verified drafts, so sub-steps carried them
        assert llm.engine.stats().spec_num_drafts_total > 0


def test_non_finite_logits_in_one_row_fail_only_that_request(engines, monkeypatch):
    llm, clean = engines("none")
    runner = llm.engine.runner
    forward = runner._logits

    def planted(model_input):
        logits = forward(model_input)
        for rows in faulty_requests(model_input):
            logits[list(rows.logit_rows)] = torch.nan
        return logits

    monkeypatch.setattr(runner, "_logits", planted)
    check_isolated(clean, run(llm, with_faulty=True), "not finite")


def test_a_request_whose_output_cannot_be_made_fails_alone(engines, monkeypatch):
    llm, clean = engines("none")
    processor = llm.engine.outputs
    make_output = processor.make_output

    def planted(request):
        params = request.sampling_params
        if params.max_tokens == FAULTY.max_tokens and request.num_output_tokens > FAULT_AFTER:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return make_output(request)

    monkeypatch.setattr(processor, "make_output", planted)
    faulty = run(llm, with_faulty=True)
    bad = [o for o in faulty if o.finish_reason == "error"]
    assert len(bad) == 1 and "injected" in bad[0].error
    others = [o for o in faulty if o.finish_reason != "error"]
    assert [o.output_token_ids for o in others] == [o.output_token_ids for o in clean]
