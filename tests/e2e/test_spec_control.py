"""Issue 14 item 5: a request caps (or turns off) speculation for itself, output stays
token-identical, and its speculation statistics reach the API's `usage` (tiny random Llama,
n-gram proposer)."""

from __future__ import annotations

import pytest
from openai import OpenAI

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams
from tests.engine.speculation.test_driver import record_plans
from tests.server.harness import run_server
from tests.tiny_tokenizer import save_char_tokenizer

# Repeated motifs: the n-gram proposer finds drafts in every step.
PROMPTS = [[5, 6, 7, 8, 9] * 6, [20, 21, 22, 23] * 5 + [40, 41, 42]]
FLAGS = dict(num_kv_blocks=64, threads=1, proposer="ngram", num_speculative_tokens=4)


def _llm(model_dir, tmp_path, policy: str) -> LLM:
    flags = dict(model=str(model_dir), spec_policy=policy, **FLAGS)
    flags.update(spec_profile_seconds=0.3, spec_cost_cache=str(tmp_path / "cost.json"))
    return LLM(config=EngineConfig.from_flat(flags))


def _run(llm: LLM, cap: int | None):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, max_draft_tokens=cap)
    original = llm.engine.spec.plan
    plans = record_plans(llm)
    try:
        outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.engine.spec.plan = original
    return outputs, plans


@pytest.mark.parametrize("policy", ["fixed:4", "goodput"])
def test_request_caps_its_own_speculation(tiny_model_dir, tmp_path, policy):
    """Each cap on an engine of its own (the profile cached by the first): on one engine,
    goodput's planning rest carried over from the capped-off run, whose plans all drafted
    nothing, into the next, which then planned once in 4-16 steps, and on CI's clean clone
    none of those plans drafted."""
    free, free_plans = _run(_llm(tiny_model_dir, tmp_path, policy), None)
    off, off_plans = _run(_llm(tiny_model_dir, tmp_path, policy), 0)
    one, one_plans = _run(_llm(tiny_model_dir, tmp_path, policy), 1)
    tokens = [o.output_token_ids for o in free]
    assert [o.output_token_ids for o in off] == tokens == [o.output_token_ids for o in one]
    assert max(k for p in free_plans for k in p.values()) > 1
    assert all(not plan for plan in off_plans)
    assert all(k == 1 for plan in one_plans for k in plan.values())
    for output in off:
        assert output.spec is not None and output.spec.proposer == "ngram"
        assert output.spec.num_draft_tokens == output.spec.num_drafts == 0
    assert sum(o.spec.num_draft_tokens for o in one) > 0
    for output in one:  # at most one draft per verify step
        assert output.spec.num_draft_tokens == output.spec.num_drafts
        assert output.spec.num_accepted_tokens <= output.spec.num_draft_tokens
    if policy == "fixed:4":
        assert sum(o.spec.num_draft_tokens for o in free) > sum(o.spec.num_drafts for o in free)


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory):
    from tests.conftest import build_tiny_llama

    path = save_char_tokenizer(build_tiny_llama(tmp_path_factory.mktemp("tiny-spec")))
    config = EngineConfig.from_flat(dict(model=str(path), spec_policy="fixed:4", **FLAGS))
    server = run_server(LLMEngine.from_config(config))
    yield server
    server.stop()


def test_usage_reports_speculation(spec_server):
    client = OpenAI(base_url=spec_server.api, api_key="x", max_retries=0)
    prompt = "abcabcabcabcabcabc"
    model = spec_server.async_engine.model_name
    common = dict(model=model, prompt=prompt, max_tokens=16, temperature=0)
    full = client.completions.create(**common, extra_body={"ignore_eos": True})
    spec = full.usage.model_extra["speculation"]
    assert spec["proposer"] == "ngram" and spec["verify_steps"] >= 1
    assert 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
    off = client.completions.create(
        **common, extra_body={"ignore_eos": True, "speculation": {"max_draft_tokens": 0}}
    )
    assert off.choices[0].text == full.choices[0].text
    assert off.usage.model_extra["speculation"]["draft_tokens"] == 0
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"speculation": {"max_draft_tokens": 2}},
    )
    usage = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert usage[0].model_extra["speculation"]["proposer"] == "ngram"
