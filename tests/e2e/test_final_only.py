"""Offline generate reports each request once, finished (final_only), and that output is the one
the per-step stream ends with: tokens, text, logprobs, finish reason; with stop strings it keeps
reporting every step (they are matched on the text as it grows) and ends the same (SmolLM2-135M,
real tokenizer, greedy)."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = ["The capital of France is", "List three colours:", "def add(a, b):"]


@pytest.fixture(scope="module")
def llm(smollm2_path) -> LLM:
    flags = dict(model=str(smollm2_path), max_model_len=512, num_kv_blocks=64, threads=1)
    return LLM(config=EngineConfig.from_flat(flags))


def summary(output) -> tuple:
    return (
        output.request_id,
        output.output_token_ids,
        output.new_token_ids,
        output.text,
        output.new_text,
        output.finish_reason,
        output.stop_reason,
        [(lp.token_id, round(lp.logprob, 5)) for lp in output.logprobs or ()],
    )


@pytest.mark.parametrize("stop", [(), ("\n",)])
def test_final_only_equals_the_end_of_the_stream(llm, stop):
    params = SamplingParams(max_tokens=20, temperature=0, logprobs=1, stop=stop)
    seen: list = []
    streamed = llm.generate(PROMPTS, params, use_tqdm=False, on_output=seen.append)
    assert len(seen) > len(PROMPTS)  # a stream: outputs every step
    steps = []
    original = llm.engine.step

    def step():
        outputs = original()
        steps.append(outputs)
        return outputs

    llm.engine.step = step
    try:
        final = llm.generate(PROMPTS, params, use_tqdm=False)
    finally:
        llm.engine.step = original
    reported = [o for outputs in steps for o in outputs]
    if not stop:  # one output each; stop strings need the text every step, so a stream
        assert len(reported) == len(PROMPTS) and all(o.finished for o in reported)
    # the ids differ by the offline counter only
    assert [summary(o)[1:] for o in final] == [summary(o)[1:] for o in streamed]
    if stop:
        assert any(o.stop_reason == "\n" for o in final)  # a stop string did cut one
        assert all("\n" not in o.text for o in final)
