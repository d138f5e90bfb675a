"""A GGUF draft model's knobs: `--draft-weights` (auto: int8 activations, which cannot change
the output) and `--draft-vocab N` (a head over the first N token ids only).

The draft of a GGUF target runs int8 activations unless told otherwise, and greedy and seeded
output stay the target's.

Its logits for those ids are the full head's, bit for bit (same rows, same kernels), and -inf
past N, so it never drafts a later id; output is unchanged (greedy token for token, seeded
sampling draw for draw), alone and batched, with every KV block back in the pool. Run on the
K-quant GGUF (the head on the integer tile kernels) drafting for itself, and on a float
safetensors model with a self:N draft.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from engine.speculation.proposers.draft_runner import VocabPrefixHead

GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
SEEDED = SamplingParams(temperature=1.0, seed=7, max_tokens=32, ignore_eos=True)
PROMPTS = [[5, 9, 17, 33, 5, 9, 17, 33, 5, 9], list(range(40, 72)), [7] * 12, [200, 3, 90, 41]]


def make_llm(path, **flat) -> LLM:
    base = dict(model=str(path), num_kv_blocks=64, threads=1)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def draft_llm(path, draft: str, vocab: int) -> LLM:
    spec = dict(speculative_proposer="draft", spec_policy="fixed:4", draft_vocab=vocab)
    return make_llm(path, draft_model=draft, **spec)


def generate(llm: LLM, params: SamplingParams) -> list[list[int]]:
    return [o.output_token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def record_drafts(llm: LLM) -> list[int]:
    """Every drafted token id, as the proposer hands them out."""
    proposer, seen = llm.engine.spec.proposer, []
    original = proposer.propose

    def propose(requests):
        drafts = original(requests)
        seen.extend(t for chain in drafts.chains.values() for t in chain)
        return drafts

    proposer.propose = propose
    return seen


@pytest.fixture(scope="module")
def cases(kquant_gguf, tiny_model_dir) -> dict[str, tuple[str, str]]:
    """name -> (target, draft)."""
    return {"kquant": (str(kquant_gguf), str(kquant_gguf)), "self": (str(tiny_model_dir), "self:1")}


@pytest.mark.parametrize("name", ["kquant", "self"])
def test_the_prefix_logits_are_the_full_heads(cases, name):
    target, draft = cases[name]
    runner = draft_llm(target, draft, 100).engine.spec.proposer.runner
    model = runner.model.target if draft.startswith("self:") else runner.model
    hidden = torch.randn(3, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    full = model.compute_logits(hidden)
    got = runner.head(hidden)
    assert got.shape == full.shape
    assert torch.equal(got[:, :100], full[:, :100])
    assert torch.isneginf(got[:, 100:]).all()


@pytest.mark.parametrize("name", ["kquant", "self"])
def test_output_is_unchanged_and_drafts_stay_inside_the_prefix(cases, name):
    target, draft = cases[name]
    plain = make_llm(target, spec_policy="off")
    want_greedy, want_seeded = generate(plain, GREEDY), generate(plain, SEEDED)
    llm = draft_llm(target, draft, 60)
    drafted = record_drafts(llm)
    assert generate(llm, GREEDY) == want_greedy
    assert generate(llm, SEEDED) == want_seeded
    assert [llm.generate([p], GREEDY, use_tqdm=False)[0].output_token_ids for p in PROMPTS] == (
        want_greedy
    )
    assert drafted and max(drafted) < 60
    stats = llm.engine.stats()
    assert stats.spec_num_draft_tokens_total > 0
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.parametrize("setting, act", [("auto", "int8"), ("gguf", "int16")])
def test_a_gguf_draft_runs_int8_activations_unless_told(kquant_gguf, setting, act):
    plain = generate(make_llm(kquant_gguf, spec_policy="off"), GREEDY)
    spec = dict(speculative_proposer="draft", spec_policy="fixed:4", draft_weights=setting)
    llm = make_llm(kquant_gguf, draft_model=str(kquant_gguf), **spec)
    draft = llm.engine.spec.proposer.runner.model
    assert draft.layers[0].mlp.gate_up_proj.activations == act
    assert llm.engine.runner.model.layers[0].mlp.gate_up_proj.activations == "int16"
    assert generate(llm, GREEDY) == plain
    assert llm.engine.stats().spec_num_accepted_tokens_total > 0
    with pytest.raises(ValueError, match="draft_weights must be one of"):
        EngineConfig.from_flat({"draft_model": "self:1", "draft_weights": "int4"})


def test_bad_limits_are_refused(cases, tiny_model_dir):
    with pytest.raises(ValueError, match="draft_vocab must be an integer >= 0"):
        EngineConfig.from_flat({"draft_model": "self:1", "draft_vocab": -1})
    with pytest.raises(ValueError, match="needs --draft-model"):
        EngineConfig.from_flat({"draft_vocab": 100})
    with pytest.raises(ValueError, match="--draft-vocab must be in 1.."):
        draft_llm(str(tiny_model_dir), "self:1", 10**6)


def test_the_head_refuses_sizes_outside_the_vocabulary(tiny_model_dir):
    model = make_llm(tiny_model_dir).engine.runner.model
    with pytest.raises(ValueError, match="--draft-vocab"):
        VocabPrefixHead(model, 0)
