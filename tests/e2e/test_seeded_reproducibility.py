"""A seeded sampled request gives the same text with speculation off, at any k, alone or
batched (DESIGN §5): the token at position t is drawn with uniform(seed, t) whatever the step
looks like, and verification only ever emits the target's own tokens.

Tiny Markov-leaning model (tests/e2e/test_spec_tiny.py) so n-gram drafts are often accepted,
sampled at temperature 0.8 with top-p 0.95; each request has its own seed. Compared with the
plain run: n-gram chains and trees under a fixed k, every request alone, and a policy that
draws k afresh for every request at every step; the drafts must really be accepted and
rejected, and the KV pool must end whole.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.e2e.test_spec_tiny import build_markov_leaning_llama

NUM_PROMPTS = 6
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_markov_leaning_llama(tmp_path_factory.mktemp("tiny-markov"))


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(3)
    phrases = [[rng.randrange(3, 32) for _ in range(rng.randint(3, 6))] for _ in range(3)]
    return [phrases[i % 3] * (2 + i % 3) for i in range(NUM_PROMPTS)]


def params(index: int) -> SamplingParams:
    return SamplingParams(
        temperature=0.8, top_p=0.95, seed=100 + index, max_tokens=NEW_TOKENS, ignore_eos=True
    )


def make_llm(model_dir: Path, **flat) -> LLM:
    base = dict(model=str(model_dir), dtype="float32", num_kv_blocks=256, threads=1)
    base.update(spec_profile_seconds=0)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def generate(llm: LLM, prompts: list[list[int]], indices: list[int]) -> list[list[int]]:
    outputs = llm.generate(prompts, [params(i) for i in indices], use_tqdm=False)
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks, "KV blocks leaked"
    return [o.output_token_ids for o in outputs]


@pytest.fixture(scope="module")
def plain(model_dir, prompts) -> list[list[int]]:
    torch.set_num_threads(1)
    return generate(make_llm(model_dir), prompts, list(range(NUM_PROMPTS)))


class RandomK:
    """A policy drawing k in 0..max for every request at every step."""

    last_predicted_step_time = None

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def plan(self, candidates, base):
        plan = {c.request_id: self.rng.randint(0, c.max_draft_tokens) for c in candidates}
        return {request_id: k for request_id, k in plan.items() if k > 0}

    def observe(self, results, features, step_seconds) -> None:
        return None


@pytest.mark.parametrize("tree_nodes", [0, 6], ids=["chain", "tree"])
def test_speculation_keeps_seeded_text(model_dir, prompts, plain, tree_nodes):
    k = tree_nodes or 3
    llm = make_llm(
        model_dir,
        speculative_proposer="ngram",
        spec_policy=f"fixed:{k}",
        spec_tree_nodes=tree_nodes,
    )
    assert generate(llm, prompts, list(range(NUM_PROMPTS))) == plain
    stats = llm.engine.stats()
    assert 0 < stats.spec_num_accepted_tokens_total < stats.spec_num_draft_tokens_total
    for i in (0, 4):  # alone: other batch shapes, other steps
        assert generate(llm, prompts[i : i + 1], [i]) == plain[i : i + 1]
    llm.engine.spec.policy = RandomK(seed=tree_nodes)
    assert generate(llm, prompts, list(range(NUM_PROMPTS))) == plain


def test_a_different_seed_changes_the_text(model_dir, prompts, plain):
    llm = make_llm(model_dir)
    other = llm.generate(
        prompts[:1],
        SamplingParams(temperature=0.8, top_p=0.95, seed=999, max_tokens=NEW_TOKENS),
        use_tqdm=False,
    )
    assert other[0].output_token_ids != plain[0]
