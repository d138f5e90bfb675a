"""Greedy speculation on a K-quant model (llama.cpp's Q4_K_M mix: Q4_K and Q6_K blocks on the
integer tile kernels, the default int16 activations) reproduces plain decoding token for token:
n-gram chains and trees, alone and in a batch, with every KV block back in the pool after."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
# Repetitive prompts: the n-gram proposer finds matches, so drafts are offered and some accepted.
PROMPTS = [[5, 9, 17, 33, 5, 9, 17, 33, 5, 9, 17, 33, 5, 9], list(range(40, 72)) * 2, [7] * 20]
CONFIGS = {
    "chain": dict(speculative_proposer="ngram", spec_policy="fixed:4", spec_tree_nodes=0),
    "tree": dict(speculative_proposer="ngram", spec_policy="fixed:6", spec_tree_nodes=6),
}


def make_llm(path, **flat) -> LLM:
    base = dict(model=str(path), dtype="float32", num_kv_blocks=64, threads=1)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


@pytest.fixture(scope="module")
def plain(kquant_gguf):
    llm = make_llm(kquant_gguf, spec_policy="off")
    return [o.output_token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_speculation_on_k_quants_matches_plain_decoding(kquant_gguf, plain, name):
    llm = make_llm(kquant_gguf, **CONFIGS[name])
    layer = llm.engine.runner.model.layers[0]
    assert {run.type_name for run in layer.mlp.down_proj.runs} == {"Q6_K"}
    assert layer.mlp.gate_up_proj.activations == "int16"
    batched = [o.output_token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]
    alone = [llm.generate([p], GREEDY, use_tqdm=False)[0].output_token_ids for p in PROMPTS]
    assert batched == plain and alone == plain
    stats = llm.engine.stats()
    assert stats.spec_num_accepted_tokens_total > 0  # verification really ran
    assert stats.num_free_blocks == stats.num_total_blocks
