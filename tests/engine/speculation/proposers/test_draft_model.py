"""Draft-model proposer on tiny random Llamas (token ids, float32, one thread).

Drafts: a noisy copy of the target (its own KV cache, partial acceptance), the target itself
loaded as a separate model (own cache: greedy acceptance must be 100%), self:N (the target's
first N layers, sharing its cache) and an unrelated random model. Greedy output must equal
speculation off token for token: alone, in batches where a random policy makes requests start
and stop speculating with varying k, and under preemption, with no KV block leaked. The drafts
themselves must be the draft model's own greedy choices, recomputed with transformers from
scratch, which shows the mirrored paged cache holds the right K/V after catch-ups, rejected
drafts, preemption, prefix-cache hits and n > 1 forks.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from engine.speculation.proposers.draft_runner import check_same_vocabulary, parse_self_draft
from tests.conftest import build_tiny_llama

GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
_rng = random.Random(0)
_SHARED = [_rng.randrange(3, 256) for _ in range(40)]  # a prefix two prompts share (prefix cache)
PROMPTS = [[_rng.randrange(3, 256) for _ in range(_rng.randrange(5, 90))] for _ in range(6)] + [
    _SHARED + [7, 8],
    _SHARED + [9, 10, 11],
]
MODES = {"chain": 0, "tree": 6}


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # engines below set one thread process-wide
    yield
    torch.set_num_threads(threads)


def noisy_copy(source, path, scale: float, seed: int = 1):
    """The source model with Gaussian noise added to every weight: a draft that agrees with
    the target often but not always."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(source)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def drafts(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """Draft kind -> --draft-model value."""
    return {
        "target": str(tiny_model_dir),
        "self:2": "self:2",
        "self:1": "self:1",
        "noisy": str(noisy_copy(tiny_model_dir, tmp_path_factory.mktemp("noisy"), 0.002)),
        "other": str(build_tiny_llama(tmp_path_factory.mktemp("other"), seed=1)),
    }


def make_llm(model_dir, **flat) -> LLM:
    base = dict(model=str(model_dir), num_kv_blocks=256, max_num_batched_tokens=512, threads=1)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def make_spec_llm(model_dir, draft_model: str, mode: str, **flat) -> LLM:
    return make_llm(
        model_dir,
        speculative_proposer="draft",
        draft_model=draft_model,
        spec_tree_nodes=MODES[mode],
        spec_policy="fixed:4",
        **flat,
    )


def generate(llm: LLM, prompts, params=GREEDY) -> list[list[int]]:
    return [o.output_token_ids for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_pool_restored(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert not llm.engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks


class RandomPolicy:
    """k drawn in 0..max_draft_tokens per request and step, and never for every third request: requests
    start and stop speculating, so drafts must catch up over several tokens."""

    last_predicted_step_time = None

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def plan(self, candidates, base):
        plan = {}
        for candidate in candidates:
            if int(candidate.request_id.rsplit("-", 1)[-1]) % 3 != 0:
                plan[candidate.request_id] = self.rng.randint(0, candidate.max_draft_tokens)
        return {request_id: k for request_id, k in plan.items() if k > 0}

    def observe(self, results, features, step_seconds) -> None:
        return None


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> list[list[int]]:
    return generate(make_llm(tiny_model_dir), PROMPTS)


# ---- vocabulary and spec checks ----------------------------------------------------------
def test_vocabulary_size_mismatch_is_refused(tiny_model_dir, tmp_path):
    small = build_tiny_llama(tmp_path / "small", vocab_size=128)
    with pytest.raises(ValueError, match=r"vocabulary \(128 tokens\) differs .* \(256\)"):
        make_spec_llm(tiny_model_dir, str(small), "chain")


class FakeTokenizer:
    def __init__(self, strings: list[str]) -> None:
        self.strings = strings
        self.vocab_size = len(strings)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.strings[i] for i in ids]


def test_tokenizer_mismatch_is_refused():
    words = [f"tok{i}" for i in range(300)]
    check_same_vocabulary(300, 300, FakeTokenizer(words), FakeTokenizer(list(words)))
    check_same_vocabulary(300, 300, FakeTokenizer(words), None)  # nothing more to compare
    renamed = words[:-1] + ["other"]  # the last id is always compared
    with pytest.raises(ValueError, match="token 299 is 'other' in the draft, 'tok299'"):
        check_same_vocabulary(300, 300, FakeTokenizer(words), FakeTokenizer(renamed))
    with pytest.raises(ValueError, match="draft tokenizer has 299 tokens, the target's 300"):
        check_same_vocabulary(300, 300, FakeTokenizer(words), FakeTokenizer(words[:-1]))


def test_self_draft_spec_is_checked(tiny_model_dir):
    assert parse_self_draft("self:2", 2) == 2
    for bad in ("self:0", "self:3", "self:x", "self:"):
        with pytest.raises(ValueError, match="1 <= N <= 2"):
            parse_self_draft(bad, 2)
    with pytest.raises(ValueError, match="self:3"):
        make_spec_llm(tiny_model_dir, "self:3", "chain")


# ---- greedy losslessness -----------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["target", "self:2", "noisy", "other"])
def test_greedy_is_lossless_alone_and_batched(tiny_model_dir, drafts, reference, kind, mode):
    llm = make_spec_llm(tiny_model_dir, drafts[kind], mode)
    assert generate(llm, PROMPTS[0]) == reference[:1]
    stats = llm.engine.stats()
    assert stats.spec_num_draft_tokens_total > 0
    if kind in ("target", "self:2"):  # the draft is the target: its argmax path always wins
        if mode == "chain":
            assert stats.spec_num_accepted_tokens_total == stats.spec_num_draft_tokens_total
        else:  # a tree's first node is the draft's argmax at the root, so >= 1 per step
            assert stats.spec_num_accepted_tokens_total >= stats.spec_num_drafts_total
    llm.engine.spec.policy = RandomPolicy()
    assert generate(llm, PROMPTS) == reference
    assert_pool_restored(llm)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["noisy", "self:1"])
def test_greedy_is_lossless_under_preemption(tiny_model_dir, drafts, reference, kind, mode):
    # 8 requests of up to ~110 tokens each, plus draft slots, in 10 blocks of 16 tokens.
    llm = make_spec_llm(
        tiny_model_dir, drafts[kind], mode, num_kv_blocks=10, max_num_batched_tokens=64
    )
    assert generate(llm, PROMPTS) == reference
    stats = llm.engine.stats()
    assert stats.num_preemptions_total > 0
    assert 0 < stats.spec_num_accepted_tokens_total < stats.spec_num_draft_tokens_total
    assert_pool_restored(llm)


# ---- the draft reads prefill chunks beside the target --------------------------------------
def test_the_draft_reads_prefill_chunks_in_the_targets_steps(tiny_model_dir, drafts, reference):
    # A 16-token budget splits the prompt into chunks; the draft reads each one in the step
    # the target does, so its first drafting step feeds only the root, and the cost model is
    # told what it fed to catch up before drafting.
    llm = make_spec_llm(tiny_model_dir, drafts["noisy"], "chain", max_num_batched_tokens=16)
    events = record_events(llm)
    features = []
    observe = llm.engine.spec.policy.observe

    def recording_observe(results, step_features, seconds):
        features.append(step_features)
        return observe(results, step_features, seconds)

    llm.engine.spec.policy.observe = recording_observe
    seen_at_propose = []  # the draft's K/V progress as each propose call finds it
    propose = llm.engine.spec.proposer.propose

    def recording_propose(requests):
        seen_at_propose.extend(r.memos["draft"].num_computed for r in requests)
        return propose(requests)

    llm.engine.spec.proposer.propose = recording_propose
    index = max(range(len(PROMPTS)), key=lambda i: len(PROMPTS[i]))
    prompt = PROMPTS[index]
    assert generate(llm, [prompt]) == [reference[index]]
    warms = [memos for kind, _, memos in events if kind == "warm"]
    assert len(warms) == -(-len(prompt) // 16)  # one per chunk
    assert seen_at_propose[0] == len(prompt)
    # Catch-ups before drafting reach the cost model; prefill reads ride with the prefill rows.
    fed = [f.num_catchup_tokens for f in features]
    assert sum(fed[: len(warms)]) == 0 and sum(fed[len(warms) :]) > 0
    assert_pool_restored(llm)


# ---- the drafts are the draft model's own choices ----------------------------------------
def record_proposals(llm: LLM) -> list:
    """Wrap the proposer so the test sees (verified tokens, chain, tree, params) per request."""
    proposer = llm.engine.spec.proposer
    original = proposer.propose
    records = []

    def propose(requests):
        drafts = original(requests)
        for r in requests:
            chain, tree = drafts.chains.get(r.request_id), drafts.trees.get(r.request_id)
            records.append((list(r.token_ids), chain, tree, r.params))
        return drafts

    proposer.propose = propose
    return records


def record_events(llm: LLM) -> list[tuple[str, str, dict | None]]:
    """("preempt", request id, None), and ("propose" or "warm", request id, the request's memos
    as the proposer found them) in the order they happen (warm: a prefill chunk fed to the
    draft)."""
    scheduler, proposer = llm.engine.scheduler, llm.engine.spec.proposer
    schedule, propose, warm = scheduler.schedule, proposer.propose, proposer.warm
    events: list[tuple[str, str, dict | None]] = []

    def recording_schedule(plan):
        output = schedule(plan)
        events.extend(("preempt", request_id, None) for request_id in output.preempted_ids)
        return output

    def recording(kind, call):
        def record(requests):
            events.extend((kind, r.request_id, dict(r.memos)) for r in requests)
            return call(requests)

        return record

    scheduler.schedule = recording_schedule
    proposer.propose, proposer.warm = recording("propose", propose), recording("warm", warm)
    return events


def assert_preempted_state_dropped(events: list[tuple[str, str, dict | None]]) -> None:
    """A preempted request's draft state is gone when the draft next reads it (a prefill chunk
    or drafting)."""
    preempted: set[str] = set()
    for kind, request_id, memos in events:
        if kind == "preempt":
            preempted.add(request_id)
        elif request_id in preempted:
            assert memos == {}, f"{request_id} drafted with stale state: {memos}"
            preempted.discard(request_id)
    assert any(kind == "preempt" for kind, _, _ in events)


class ReferenceDraft:
    """The draft model in transformers, run from scratch on each context (no cache)."""

    def __init__(self, path, num_layers: int | None = None) -> None:
        from transformers import LlamaForCausalLM

        self.model = LlamaForCausalLM.from_pretrained(path).eval()
        if num_layers is not None:  # a self-draft: the first layers, the same norm and head
            self.model.model.layers = self.model.model.layers[:num_layers]

    def is_argmax(self, context: list[int], token_id: int) -> bool:
        with torch.no_grad():
            logits = self.model(torch.tensor([context]), use_cache=False).logits[0, -1]
        return bool(logits[token_id] >= logits.max() - 1e-4)  # float ties are not errors


def check_drafts(reference: ReferenceDraft, context: list[int], chain, tree) -> None:
    from engine.sample.tree import children, path_to

    if chain is not None:
        for j, token_id in enumerate(chain):
            assert reference.is_argmax(context + chain[:j], token_id), (context, chain, j)
        return
    # Best-first trees add a parent's most probable child first: the first child of the root
    # and of every expanded node is the draft's argmax there.
    root_children, node_children = children(tree)
    assert reference.is_argmax(context, tree.token_ids[root_children[0]])
    for node, kids in enumerate(node_children):
        if kids:
            path = [tree.token_ids[n] for n in path_to(tree, node)]
            assert reference.is_argmax(context + path, tree.token_ids[kids[0]]), (context, tree)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["noisy", "self:1"])
def test_drafts_are_the_draft_models_greedy_choices(tiny_model_dir, drafts, kind, mode):
    # A tight cache (preemption), a shared prefix (prefix-cache hits), an n = 2 request
    # (copy-on-write fork), a sampled request in the batch, and a policy that starts and
    # stops speculation: every path that moves or invalidates the draft's K/V.
    llm = make_spec_llm(
        tiny_model_dir, drafts[kind], mode, num_kv_blocks=10, max_num_batched_tokens=64
    )
    llm.engine.spec.policy = RandomPolicy(seed=1)
    records = record_proposals(llm)
    events = record_events(llm)
    sampled = SamplingParams(max_tokens=24, temperature=1.0, seed=3, ignore_eos=True)
    forked = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True, n=2)
    params = [GREEDY] * len(PROMPTS) + [sampled, forked]
    outputs = llm.generate(PROMPTS + PROMPTS[:2], params, use_tqdm=False)
    assert outputs[-1].output_token_ids == outputs[-2].output_token_ids  # greedy n = 2
    assert llm.engine.stats().num_preemptions_total > 0
    assert_preempted_state_dropped(events)
    assert_pool_restored(llm)
    if kind.startswith("self:"):
        reference = ReferenceDraft(tiny_model_dir, num_layers=int(kind.split(":")[1]))
    else:
        reference = ReferenceDraft(drafts[kind])
    greedy_records = [r for r in records if r[3] is not None and r[3].greedy]
    assert len(greedy_records) > 20
    for context, chain, tree, _ in greedy_records:
        check_drafts(reference, context, chain, tree)


# ---- the real model ----------------------------------------------------------------------
@pytest.mark.slow
def test_smollm2_self_draft_is_greedy_lossless(smollm2_path):
    llm = make_llm(
        smollm2_path,
        num_kv_blocks=64,
        speculative_proposer="draft",
        draft_model="self:4",
        spec_policy="fixed:3",
    )
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    speculative = generate(llm, prompt, params)
    assert llm.engine.stats().spec_num_draft_tokens_total > 0
    llm.engine.spec.enabled = False  # the same engine without speculation
    assert generate(llm, prompt, params) == speculative
    assert_pool_restored(llm)
