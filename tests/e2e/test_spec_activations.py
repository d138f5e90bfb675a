"""Speculation stays greedy-lossless on the other activation paths of the GGUF kernels:
float32 activations (weights=gguf-f32) and int8 ones (weights=gguf-int8); the default, int16,
is test_spec_lossless.py's.

Each mode keeps a row's result independent of its batch (kernels/cpu), so a verify row computes
exactly what a plain decode row computes and speculation must reproduce plain decoding token
for token, as test_spec_lossless.py checks (whose prompts, policies and checks this reuses): an
n-gram tree and a self-draft chain, each in the batch of eight under random k every step, and
the n-gram tree for one prompt alone.
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
WEIGHTS = {"gguf-f32": "float32", "gguf-int8": "int8"}


@pytest.fixture(scope="module", params=list(WEIGHTS))
def reference(request):
    weights = request.param
    llm = lossless.make_llm(weights=weights)
    layers = [m for m in llm.engine.runner.model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.activations == WEIGHTS[weights] for m in layers)
    prompts = lossless.build_prompts(llm.tokenizer)
    outputs = llm.generate(prompts, lossless.GREEDY, use_tqdm=False)
    lossless.assert_pool_whole(llm)
    return weights, prompts, [o.output_token_ids for o in outputs]


@pytest.mark.parametrize("name", list(CASES))
def test_random_k_matches_plain_decoding(name, reference):
    weights, prompts, expected = reference
    llm = lossless.make_llm(weights=weights, **CASES[name])
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
