"""Sliding-window layers on their own block pool, through the whole engine: tiny random Gemma 3
(one sliding layer beside a global one) and Mistral (every layer sliding) models with a
5-position window and 8-token blocks, prompts of 20-70 tokens. Greedy tokens equal
transformers', alone, batched, chunked, with n-gram speculation, from the prefix cache, as
n > 1 forks and under preemption; the sliding layers never hold more blocks than their window
reads; on the native CPU path from a Q8_0 GGUF (Gemma 3, Phi-3) the tokens equal the unsplit
cache's."""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.core.block_manager import NULL_BLOCK
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.e2e.test_families import GREEDY, NUM_NEW, hf_greedy, one_thread  # noqa: F401
from tests.engine.models.conftest import build_hf_model
from tests.engine.models.test_gguf_loader import GGUF_ARCH, GGUF_FAMILY_OVERRIDES, write_gguf

FAMILIES = ["gemma3_text", "mistral"]
BLOCK = 8
WINDOW = 5
# Four seats and 16-token steps: the window pool needs 4 * (1 + 3) + 2 = 18 blocks, far below
# the budget's 256, so the cache splits.
POOLED = dict(num_kv_blocks=256, block_size=BLOCK, max_num_seqs=4, max_num_batched_tokens=16)
SETTINGS = {
    "batched": dict(),
    "chunked": dict(max_num_batched_tokens=8),
    "ngram": dict(speculative_proposer="ngram", spec_policy="fixed:3"),
    "recycle-tree": dict(speculative_proposer="recycle", spec_policy="fixed:6", spec_tree_nodes=6),
}
MOTIF = [5, 6, 7, 8, 9] * 8  # drafts get accepted: chains and tree paths land in the cache


def prompts(count: int = 4, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(20, 70))] for _ in range(count)]


def make_llm(path, **flat) -> LLM:
    base = dict(model=str(path), dtype="float32", **POOLED)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def run_checked(llm: LLM, requests: list[list[int]], params=GREEDY) -> dict[str, list[int]]:
    """Step the engine, checking after every step that each running request holds only the
    window blocks its last step's queries read (positions start - WINDOW + 1 on, at most
    ceil((WINDOW - 1 + tokens) / BLOCK) + 1 blocks); then that every block is back."""
    engine = llm.engine
    manager = engine.scheduler.block_manager
    assert manager.window_pool is not None, "the cache did not split"
    for i, prompt in enumerate(requests):
        engine.add_request(f"r{i}", prompt, params)
    outputs = {}
    while engine.has_unfinished_requests():
        starts = {r.request_id: r.num_computed_tokens for r in engine.scheduler.running}
        for output in engine.step():
            if output.finished:
                outputs[output.request_id] = list(output.output_token_ids)
        for request in engine.scheduler.running:
            start = starts.get(request.request_id, 0)
            num_tokens = request.num_computed_tokens + 1 - start
            table = request.window_block_ids
            first = manager.first_visible_block(start)
            assert all(b == NULL_BLOCK for b in table[:first]), (start, table)
            held = [b for b in table if b != NULL_BLOCK]
            assert len(held) <= -(-(WINDOW - 1 + num_tokens) // BLOCK) + 1, (start, table)
            assert len(request.block_ids) == len(table)
    window = manager.window_pool
    assert window.num_free_blocks == window.num_total_blocks
    assert manager.num_free_blocks == manager.num_total_blocks
    return outputs


def tokens(outputs: dict[str, list[int]]) -> list[list[int]]:
    return [outputs[f"r{i}"] for i in range(len(outputs))]


@pytest.mark.parametrize("model_type", FAMILIES)
def test_window_pool_greedy_matches_transformers(tmp_path, model_type):
    path, hf_model = build_hf_model(tmp_path, model_type, sliding_window=WINDOW)
    requests = [*prompts(), MOTIF]
    want = [hf_greedy(hf_model, p) for p in requests]
    for setting, flat in SETTINGS.items():
        assert tokens(run_checked(make_llm(path, **flat), requests)) == want, setting


def test_window_pool_from_the_prefix_cache_as_forks_and_under_preemption(tmp_path):
    path, hf_model = build_hf_model(tmp_path, "gemma3_text", sliding_window=WINDOW)
    prompt = prompts(1, seed=3)[0]
    want = hf_greedy(hf_model, prompt)
    llm = make_llm(path)
    assert tokens(run_checked(llm, [prompt])) == [want]
    # The same prompt again: served from the prefix cache, window blocks included.
    hits = llm.engine.scheduler.block_manager.prefix_cache_hits
    assert tokens(run_checked(llm, [prompt])) == [want]
    assert llm.engine.scheduler.block_manager.prefix_cache_hits > hits
    # n = 2 greedy choices fork the prompt's blocks in both pools.
    two = SamplingParams(max_tokens=NUM_NEW, temperature=0, ignore_eos=True, n=2)
    forked = run_checked(llm, [prompt + [7]], two)
    assert list(forked.values()) == [hf_greedy(hf_model, prompt + [7])] * 2
    # A budget of 20 unsplit blocks: 22 full-pool blocks (176 positions) beside the window
    # pool's 18, for four requests of up to 80 positions: some must wait or be preempted.
    small = make_llm(path, num_kv_blocks=20)
    manager = small.engine.scheduler.block_manager
    assert manager.window_pool is not None and manager.num_total_blocks == 22
    long_prompts = prompts(4, seed=5)
    got = tokens(run_checked(small, long_prompts))
    assert got == [hf_greedy(hf_model, p) for p in long_prompts]
    assert small.engine.scheduler.num_preemptions_total > 0


# A GGUF Mistral is a llama one without a window (as llama.cpp runs it): Phi-3 slides instead.
@pytest.mark.parametrize("model_type", ["gemma3_text", "phi3"])
def test_window_pool_on_the_native_path_equals_the_unsplit_cache(tmp_path, model_type):
    from kernels.cpu import native_available

    if not native_available():
        pytest.skip("the native CPU kernels are unavailable here")
    import gguf

    overrides = {**GGUF_FAMILY_OVERRIDES.get(model_type, {}), "sliding_window": WINDOW}
    hf_dir, _ = build_hf_model(tmp_path / "hf", model_type, **overrides)
    path = write_gguf(
        tmp_path / "m.gguf", hf_dir, gguf.GGMLQuantizationType.Q8_0, arch=GGUF_ARCH[model_type]
    )
    unsplit = make_llm(path, weights="gguf-f32", sliding_window_pool=False)
    assert unsplit.engine.scheduler.block_manager.window_pool is None
    requests = [*prompts(), MOTIF]
    want = [o.output_token_ids for o in unsplit.generate(requests, GREEDY, use_tqdm=False)]
    for setting, flat in SETTINGS.items():
        got = tokens(run_checked(make_llm(path, weights="gguf-f32", **flat), requests))
        assert got == want, setting
