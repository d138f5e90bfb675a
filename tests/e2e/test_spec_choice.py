"""Proposer choice (issue #12) through the whole engine, on tiny random Llamas.

One engine loads n-gram, Token Recycling and a draft model (self:1, sharing the target's
cache, or a noisy copy with its own cache). Greedy and seeded sampled output must equal
speculation off token for token (a draft is accepted iff it equals the target's token at
that position's uniform, whoever proposed it) under
  * a policy that draws the proposer and k afresh per request and step, so every request
    switches proposers back and forth and skips steps (the draft model must catch up), and
  * the goodput choice policy itself;
and afterwards the KV pool is whole and no proposer or policy keeps per-request state.
The slow test repeats the switching and the goodput choice on SmolLM2-135M (self:4 draft).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.proposers.proposer_set import ProposerSet
from tests.e2e.test_spec_lossless import reference_run  # noqa: F401 (a fixture, slow test)
from tests.engine.factories import request_state_in
from tests.engine.speculation.proposers.test_draft_model import (
    ReferenceDraft,
    check_drafts,
    noisy_copy,
)

NAMES = ("ngram", "recycle", "draft")
_rng = random.Random(3)
# Repeated motifs for the n-gram proposer, random tokens for the others.
PROMPTS = [
    [5, 6, 7, 8, 9] * 6,
    [20, 21, 22, 23] * 5 + [40, 41, 42],
    [_rng.randrange(3, 256) for _ in range(40)],
    [60, 61, 62, 60, 61, 63, 60, 61, 62, 60, 61],
]
GREEDY = SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)
SAMPLED = [SamplingParams(max_tokens=32, temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2)]
MODES = {"chain": dict(spec_tree_nodes=0), "tree": dict(spec_tree_nodes=6)}


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # engines below set one thread process-wide
    yield
    torch.set_num_threads(threads)


class RandomChoicePolicy:
    """A proposer and k in 0..max drawn per request and step (a SpecPolicy with choice)."""

    last_predicted_step_time = None

    def __init__(self, names, seed: int = 0) -> None:
        self.names, self.rng = names, random.Random(seed)
        self.chosen: dict[str, str] = {}
        self.runs: set[tuple[str, str]] = set()  # (request, proposer) pairs planned
        self.observed: list[tuple[list, object]] = []  # (results, features) per step

    def plan(self, candidates, base):
        self.chosen = {c.request_id: self.rng.choice(self.names) for c in candidates}
        plan = {c.request_id: self.rng.randint(0, c.max_draft_tokens) for c in candidates}
        plan = {request_id: k for request_id, k in plan.items() if k > 0}
        self.runs.update((r, self.chosen[r]) for r in plan)
        for candidate in candidates:
            candidate.spec.proposer = self.chosen[candidate.request_id]
        return plan

    def observe(self, results, features, step_seconds) -> None:
        self.observed.append((list(results), features))


def make_llm(model_dir, tmp_path, **flat) -> LLM:
    base = dict(
        model=str(model_dir),
        num_kv_blocks=128,
        threads=1,
        spec_profile_seconds=0.3,
        spec_cost_cache=str(tmp_path / "cost_models.json"),
    )
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def run(llm: LLM, max_tokens: int = 32) -> list[list[int]]:
    prompts = PROMPTS + PROMPTS[:2]
    params = [GREEDY] * len(PROMPTS) + SAMPLED
    params = [dataclasses.replace(p, max_tokens=max_tokens) for p in params]
    return [o.output_token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_nothing_kept(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert not llm.engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks, "KV blocks leaked"
    # Everything kept about a request lived on it: no engine object holds a finished one.
    assert not request_state_in(llm.engine, lambda key: str(key).startswith("offline-"))


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory) -> list[list[int]]:
    return run(make_llm(tiny_model_dir, tmp_path_factory.mktemp("off")))


@pytest.mark.parametrize("mode", MODES)
def test_random_proposer_switching_is_lossless_and_leaks_nothing(
    tiny_model_dir, tmp_path, reference, mode
):
    flat = dict(speculative_proposer="auto", draft_model="self:1", **MODES[mode])
    llm = make_llm(tiny_model_dir, tmp_path, **flat)
    assert isinstance(llm.engine.spec.proposer, ProposerSet)
    policy = RandomChoicePolicy(NAMES)
    llm.engine.spec.policy = policy
    outputs = llm.generate(PROMPTS + PROMPTS[:2], [GREEDY] * 4 + SAMPLED, use_tqdm=False)
    assert [o.output_token_ids for o in outputs] == reference
    assert_nothing_kept(llm)
    # The cost model sees the draft model's passes only for the requests it drafted for.
    for results, features in policy.observed:
        drafted = [r.num_draft_tokens for r in results if r.proposer == "draft"]
        assert features.num_draft_steps == max(drafted, default=0)
    assert any(f.num_draft_steps == 0 < f.num_draft_tokens for _, f in policy.observed)
    # Every request ran more than one proposer.
    for output in outputs:
        assert len({name for r, name in policy.runs if r == output.request_id}) >= 2
    # Per-request, per-proposer stats add up to the request's and the engine's totals.
    stats = llm.engine.stats()
    by_name = {
        name: (drafts, tokens, accepted)
        for name, drafts, tokens, accepted in stats.spec_proposer_totals
    }
    assert set(by_name) == set(NAMES) and stats.spec_num_accepted_tokens_total > 0
    assert sum(t for _, t, _ in by_name.values()) == stats.spec_num_draft_tokens_total
    assert sum(a for _, _, a in by_name.values()) == stats.spec_num_accepted_tokens_total
    for output in outputs:
        spec = output.spec
        assert spec.proposer == "ngram,recycle,draft"
        shares = spec.by_proposer.values()
        assert sum(p.num_draft_tokens for p in shares) == spec.num_draft_tokens
        assert sum(p.num_accepted_tokens for p in shares) == spec.num_accepted_tokens
        assert sum(p.num_drafts for p in shares) == spec.num_drafts


def test_goodput_choice_is_lossless_and_uses_several_proposers(tiny_model_dir, tmp_path):
    longer = run(make_llm(tiny_model_dir, tmp_path / "off"), max_tokens=96)
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="auto", draft_model="self:1")
    policy = llm.engine.spec.policy
    assert isinstance(policy, GoodputPolicy) and policy.proposers == NAMES
    # Probes every 4 plans: requests that accept much finish in fewer plans than the default.
    policy.explore_interval = 4
    assert run(llm, max_tokens=96) == longer
    assert_nothing_kept(llm)
    used = {name for name, _, tokens, _ in llm.engine.stats().spec_proposer_totals if tokens}
    assert len(used) >= 2, f"goodput choice ran only {used}"


def test_an_own_cache_draft_catches_up_after_other_proposers_ran(tiny_model_dir, tmp_path):
    """A noisy copy with its own KV cache, used on random steps only: whenever it drafts,
    its drafts are its own greedy choices on the full verified context, so its cache caught
    up on the tokens verified while n-gram ran or nobody speculated."""
    noisy = str(noisy_copy(tiny_model_dir, tmp_path / "noisy", 0.002))
    llm = make_llm(tiny_model_dir, tmp_path, speculative_proposer="ngram,draft", draft_model=noisy)
    llm.engine.spec.policy = RandomChoicePolicy(("ngram", "draft"), seed=2)
    draft = llm.engine.spec.proposer.proposers["draft"]
    original, records = draft.propose, []

    def propose(requests):
        drafts = original(requests)
        records.extend((list(r.token_ids), drafts.chains.get(r.request_id)) for r in requests)
        return drafts

    draft.propose = propose
    llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert len(records) > 10
    skipped = [context for context, _ in records]
    assert any(len(b) - len(a) > 2 for a, b in zip(skipped, skipped[1:]))  # gaps to catch up
    reference = ReferenceDraft(noisy)
    for context, chain in records:
        check_drafts(reference, context, chain, None)
    assert not request_state_in(draft, lambda key: str(key).startswith("offline-"))


# ---- SmolLM2-135M (slow): the copy and chat prompts of test_spec_lossless -----------------
@pytest.mark.slow
def test_smollm2_proposer_switching_is_greedy_lossless(reference_run):  # noqa: F811
    from tests.e2e.test_spec_lossless import GREEDY as SMOL_GREEDY
    from tests.e2e.test_spec_lossless import SELF_DRAFT, assert_pool_whole, assert_same_tokens
    from tests.e2e.test_spec_lossless import make_llm as make_smollm2

    prompts, expected = reference_run
    llm = make_smollm2(speculative_proposer="auto", draft_model=SELF_DRAFT)
    goodput = llm.engine.spec.policy
    llm.engine.spec.policy = RandomChoicePolicy(NAMES, seed=5)
    assert_same_tokens(llm.generate(prompts, SMOL_GREEDY, use_tqdm=False), expected)
    assert_pool_whole(llm)
    llm.engine.spec.policy = goodput  # and under the goodput choice itself
    assert_same_tokens(llm.generate(prompts, SMOL_GREEDY, use_tqdm=False), expected)
    assert_pool_whole(llm)
    drafted = {name: tokens for name, _, tokens, _ in llm.engine.stats().spec_proposer_totals}
    assert all(drafted[name] > 0 for name in NAMES)
