"""Draft-model speculation on a real pair: Qwen2.5-Coder-0.5B drafts for 1.5B, greedy, both on
the native CPU kernels (weights=gguf), is token-identical to the 1.5B decoding alone.

Eight chat-templated prompts (four code-editing prompts from
benchmarks/data/workload_code_edit.jsonl, four open-ended chat prompts) get 64 greedy tokens
each in one batch: speculation off is the reference; draft chains (k = 4) and best-first draft
trees (8 nodes) must reproduce it exactly, leave the KV pool whole, and accept drafts. The draft
must be the 0.5B's own GGUF, loaded with the same weights setting as the target. One engine
lives at a time (each holds ~1.6 GB of blocks).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.models.linear import QuantLinear
from engine.sampling_params import SamplingParams
from tests.e2e.test_spec_lossless import DATA_DIR, assert_pool_whole, assert_same_tokens

pytestmark = [pytest.mark.heavy, pytest.mark.slow]

CODE_EDIT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "workload_code_edit.jsonl"
NUM_EACH = 4
NEW_TOKENS = 64
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
CASES = {
    "chain": dict(spec_policy="fixed:4", num_speculative_tokens=4, spec_tree_nodes=0),
    "tree": dict(spec_policy="fixed:8", num_speculative_tokens=4, spec_tree_nodes=8),
}


def make_llm(target: Path, **flat) -> LLM:
    # 256 blocks of 16 hold the eight requests (<= ~700 + 64 + drafts tokens each).
    base = dict(model=str(target), weights="gguf", dtype="float32", num_kv_blocks=256, threads=1)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def read_texts(path: Path, count: int) -> list[str]:
    if not path.exists():
        pytest.skip(f"{path} is missing")
    return [json.loads(line)["prompt"] for line in path.read_text().splitlines()[:count]]


@pytest.fixture(scope="module")
def reference_run(qwen_pair) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, greedy outputs without speculation), code and chat prompts alternating."""
    llm = make_llm(qwen_pair[0])
    codes = read_texts(CODE_EDIT, NUM_EACH)
    chats = read_texts(DATA_DIR / "workload_chat.jsonl", NUM_EACH)
    texts = [text for pair in zip(codes, chats, strict=True) for text in pair]
    template = llm.tokenizer.apply_chat_template
    prompts = [template([{"role": "user", "content": text}]) for text in texts]
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(len(o.output_token_ids) == NEW_TOKENS for o in outputs)
    assert_pool_whole(llm)
    return prompts, [o.output_token_ids for o in outputs]


@pytest.mark.parametrize("shape", CASES)
def test_draft_speculation_matches_plain_decoding(qwen_pair, reference_run, shape):
    target, draft = qwen_pair
    llm = make_llm(target, speculative_proposer="draft", draft_model=str(draft), **CASES[shape])
    draft_model = llm.engine.spec.proposer.runner.model
    assert draft_model.config.num_layers == 24  # the 0.5B, not a copy of the target
    assert isinstance(draft_model.layers[0].mlp.gate_up_proj, QuantLinear)  # same weights=gguf
    prompts, expected = reference_run
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_tokens(outputs, expected)
    assert_pool_whole(llm)
    stats = llm.engine.stats()
    accepted, drafted = stats.spec_num_accepted_tokens_total, stats.spec_num_draft_tokens_total
    per_step = accepted / stats.spec_num_drafts_total
    print(f"{shape}: {accepted}/{drafted} drafts accepted, {per_step:.2f} per verify step")
    assert per_step > 1.0  # a related model drafts well on code; a broken draft gets ~0
