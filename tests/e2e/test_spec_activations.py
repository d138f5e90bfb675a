"""Speculation stays greedy-lossless on the int8-activation path (weights=gguf-int8).

The activations of every linear layer are quantized per row (kernels/cpu, act="int8"), so a
verify row computes exactly what a plain decode row computes and speculation must reproduce
plain decoding token for token, as on the float32-activation path (test_spec_lossless.py,
whose prompts, policies and checks this reuses): an n-gram tree and a self-draft chain, each in
the batch of eight under random k every step, and the n-gram tree for one prompt alone.
"""

from __future__ import annotations

import random

import pytest

from engine.models.linear import QuantLinear
from tests.e2e import test_spec_lossless as lossless

pytestmark = pytest.mark.slow

CASES = {
    "ngram-tree": dict(speculative_proposer="ngram", **lossless.TREE),
    "draft-chain": dict(**lossless.DRAFT, **lossless.CHAIN),
}
INT8 = dict(weights="gguf-int8")


@pytest.fixture(scope="module")
def int8_reference():
    llm = lossless.make_llm(**INT8)
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.activations == "int8" for m in layers)
    prompts = lossless.build_prompts(llm.tokenizer)
    outputs = llm.generate(prompts, lossless.GREEDY, use_tqdm=False)
    lossless.assert_pool_whole(llm)
    return prompts, [o.output_token_ids for o in outputs]


@pytest.mark.parametrize("name", list(CASES))
def test_random_k_on_int8_activations_matches_plain_decoding(name, int8_reference):
    prompts, expected = int8_reference
    llm = lossless.make_llm(**INT8, **CASES[name])
    rng = random.Random(99)
    policy = lossless.ScriptedPolicy(lambda request_id, k: rng.randint(0, k))
    with lossless.policy_installed(llm, policy):
        outputs = llm.generate(prompts, lossless.GREEDY, use_tqdm=False)
    lossless.assert_same_tokens(outputs, expected)
    lossless.assert_pool_whole(llm)
    assert max(policy.chosen_k) >= 3 and sum(policy.num_accepted_tokens.values()) > 0
    if name == "ngram-tree":
        before = llm.engine.stats().spec_num_draft_tokens_total
        alone = llm.generate(prompts[0], lossless.GREEDY, use_tqdm=False)
        lossless.assert_same_tokens(alone, expected[:1])
        assert llm.engine.stats().spec_num_draft_tokens_total > before
