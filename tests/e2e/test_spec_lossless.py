"""Greedy speculative decoding is token-identical to plain decoding on SmolLM2-135M (DESIGN §5).

Eight chat-templated prompts (four copy-heavy documentation prompts cut to ~350 tokens, four
open-ended questions) get 128 greedy tokens each with speculation off: the reference. Every
proposer (n-gram, Token Recycling, a self-draft of SmolLM2's first layers), as chains and as
trees, must then reproduce the reference exactly
  * in one batch of eight where an injected policy lets only half of the requests speculate
    (so verify rows, rollbacks and plain decode rows share every forward),
  * (one config per proposer) for one prompt alone, under the config's own fixed policy,
  * (one chain and one tree config) in the batch of eight under a policy that draws k in 0..K
    afresh for every request at every step, so drafts of every length, and none, follow
    each other;
and leave the KV pool whole. One SmolLM2 load per config; engines live one at a time.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.outputs import SpecPlan
from engine.sampling_params import SamplingParams
from engine.speculation.control.policy import SpecCandidate, SpecResult
from engine.speculation.control.step_features import StepFeatures

pytestmark = pytest.mark.slow

DATA_DIR = Path(__file__).resolve().parents[3] / "shared" / "data"
NUM_EACH = 4  # copy-heavy prompts, and open-ended prompts
COPY_PROMPT_TOKENS = 340  # user text cut to this many tokens (~350 with the chat template)
NEW_TOKENS = 128
K = 4  # chain length
TREE_NODES = 8  # tree node budget
SELF_DRAFT = "self:4"  # SmolLM2's first 4 of 30 layers as the draft (cheap; acceptance ~irrelevant)
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)

CHAIN = dict(spec_policy=f"fixed:{K}", spec_tree_nodes=0)
TREE = dict(spec_policy=f"fixed:{TREE_NODES}", spec_tree_nodes=TREE_NODES)
DRAFT = dict(speculative_proposer="draft", draft_model=SELF_DRAFT)


@dataclass(frozen=True)
class SpecCase:
    name: str
    flat: dict
    alone_prompt: int | None = None  # index of the prompt also run alone (one per proposer)
    random_k: bool = False  # also run the random-k batch (one chain, one tree)


CASES = [
    SpecCase("ngram-chain", dict(speculative_proposer="ngram", **CHAIN), random_k=True),
    SpecCase("ngram-tree", dict(speculative_proposer="ngram", **TREE), alone_prompt=0),
    SpecCase("recycle-chain", dict(speculative_proposer="recycle", **CHAIN), alone_prompt=2),
    SpecCase("recycle-tree", dict(speculative_proposer="recycle", **TREE), random_k=True),
    SpecCase("draft-chain", dict(**DRAFT, **CHAIN), alone_prompt=4),
    SpecCase("draft-tree", dict(**DRAFT, **TREE)),
]


def make_llm(**flat) -> LLM:
    # 400 blocks of 16 hold the eight requests (<= ~370 + 128 + drafts tokens each) with room.
    # One intra-op thread: on a busy 2-core machine two threads can be many times slower.
    base = dict(model="smollm2-135m-instruct", dtype="float32", num_kv_blocks=400, threads=1)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def read_prompts(name: str, count: int) -> list[str]:
    path = DATA_DIR / name
    if not path.exists():
        pytest.skip(f"{path} is missing (the shared workloads live beside the repo)")
    lines = path.read_text().splitlines()[:count]
    return [json.loads(line)["prompt"] for line in lines]


def build_prompts(tokenizer) -> list[list[int]]:
    """The eight chat-templated prompts, in the order copy, copy, chat, chat, copy, copy, chat,
    chat, so that either half of the batch holds both kinds."""
    copies = [
        tokenizer.decode(tokenizer.encode(text)[:COPY_PROMPT_TOKENS])
        for text in read_prompts("workload_copy.jsonl", NUM_EACH)
    ]
    chats = read_prompts("workload_chat.jsonl", NUM_EACH)
    texts = [*copies[:2], *chats[:2], *copies[2:], *chats[2:]]
    return [tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


@pytest.fixture(scope="module")
def reference_run() -> tuple[list[list[int]], list[list[int]]]:
    """(prompt ids, greedy outputs without speculation) for build_prompts."""
    llm = make_llm()
    prompts = build_prompts(llm.tokenizer)
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert all(len(o.output_token_ids) == NEW_TOKENS for o in outputs)
    assert_pool_whole(llm)
    return prompts, [o.output_token_ids for o in outputs]


class ScriptedPolicy:
    """A SpecPolicy whose k comes from `choose(request_id, max_draft_tokens)`; it records what it
    chose and what was verified, per request."""

    last_predicted_step_time: float | None = None

    def __init__(self, choose: Callable[[str, int], int]) -> None:
        self.choose = choose
        self.num_draft_tokens: dict[str, int] = {}
        self.num_accepted_tokens: dict[str, int] = {}
        self.chosen_k: set[int] = set()

    def plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        chosen = tuple(self.choose(c.request_id, c.max_draft_tokens) for c in candidates)
        self.chosen_k.update(chosen)
        plan = zip(candidates, chosen, strict=True)
        return {c.request_id: k for c, k in plan if k > 0}

    def observe(
        self, results: Sequence[SpecResult], features: StepFeatures, step_seconds: float
    ) -> None:
        for result in results:
            request_id = result.request_id
            drafted = self.num_draft_tokens.get(request_id, 0) + result.num_draft_tokens
            accepted = self.num_accepted_tokens.get(request_id, 0) + result.num_accepted_tokens
            self.num_draft_tokens[request_id] = drafted
            self.num_accepted_tokens[request_id] = accepted


def even_request(request_id: str) -> bool:
    return int(request_id.rsplit("-", 1)[-1]) % 2 == 0


@contextmanager
def policy_installed(llm: LLM, policy: ScriptedPolicy) -> Iterator[ScriptedPolicy]:
    driver = llm.engine.spec
    original, driver.policy = driver.policy, policy
    try:
        yield policy
    finally:
        driver.policy = original


def assert_pool_whole(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert not llm.engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks, "KV blocks leaked"


def assert_same_tokens(outputs, expected: list[list[int]]) -> None:
    for index, (output, want) in enumerate(zip(outputs, expected, strict=True)):
        got = output.output_token_ids
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, f"prompt {index}: first difference at output token {first}"


@pytest.fixture(scope="module", params=CASES, ids=[case.name for case in CASES])
def case(request) -> SpecCase:
    return request.param


@pytest.fixture(scope="module")
def spec_llm(case) -> LLM:
    return make_llm(**case.flat)


def test_half_speculating_batch_matches_plain_decoding(spec_llm, reference_run):
    prompts, expected = reference_run

    def choose(request_id: str, max_draft_tokens: int) -> int:
        return max_draft_tokens if even_request(request_id) else 0

    with policy_installed(spec_llm, ScriptedPolicy(choose)) as policy:
        outputs = spec_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_tokens(outputs, expected)
    assert_pool_whole(spec_llm)
    speculated = {request_id for request_id, n in policy.num_draft_tokens.items() if n > 0}
    assert speculated == {o.request_id for o in outputs if even_request(o.request_id)}
    assert len(speculated) == len(prompts) // 2
    assert sum(policy.num_accepted_tokens.values()) > 0


def test_alone_matches_plain_decoding(spec_llm, case, reference_run):
    if case.alone_prompt is None:
        pytest.skip("one config per proposer runs a prompt alone")
    prompts, expected = reference_run
    index = case.alone_prompt
    before = spec_llm.engine.stats()
    outputs = spec_llm.generate(prompts[index], GREEDY, use_tqdm=False)
    assert_same_tokens(outputs, expected[index : index + 1])
    assert_pool_whole(spec_llm)
    after = spec_llm.engine.stats()
    assert after.spec_num_draft_tokens_total > before.spec_num_draft_tokens_total


def test_random_k_every_step_matches_plain_decoding(spec_llm, case, reference_run):
    if not case.random_k:
        pytest.skip("random k runs on one chain and one tree config")
    prompts, expected = reference_run
    rng = random.Random(1234)
    policy = ScriptedPolicy(lambda request_id, max_draft_tokens: rng.randint(0, max_draft_tokens))
    with policy_installed(spec_llm, policy):
        outputs = spec_llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_tokens(outputs, expected)
    assert_pool_whole(spec_llm)
    assert {0, 1, 2} <= policy.chosen_k and max(policy.chosen_k) >= 3  # k really varied
