"""A 16-bit KV cache (--kv-cache-dtype float16 / bfloat16) through the whole engine on the
native CPU path (K-quant GGUF, the decoder stack): greedy speculation stays token-identical to
plain decoding with the same cache type, alone and batched, no block leaks; against a float32
cache the greedy tokens are identical or part at a near-tie (tests/parity.py's rule); the
cache really holds 16-bit numbers and twice the blocks fit the same memory."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.parity import near_tie_report

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
PROMPTS = [[5, 9, 17, 33, 5, 9, 17, 33, 5, 9, 17, 33, 5, 9], list(range(40, 72)) * 2, [7] * 20]
# Logprob gap below which two greedy runs may part (as the half-precision parity tests use).
NEAR_TIE = 0.05


def make_llm(path, **flat) -> LLM:
    base = dict(model=str(path), dtype="float32", kv_cache_memory="4MiB", threads=1)
    return LLM(config=EngineConfig.from_flat({**base, **flat}))


def greedy(llm: LLM, prompts=PROMPTS) -> list[list[int]]:
    return [o.output_token_ids for o in llm.generate(prompts, GREEDY, use_tqdm=False)]


@pytest.fixture(scope="module")
def float32_run(kquant_gguf):
    llm = make_llm(kquant_gguf, spec_policy="off")
    return llm, greedy(llm)


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_speculation_with_a_16_bit_cache_matches_plain_decoding(kquant_gguf, kv_dtype):
    plain = greedy(make_llm(kquant_gguf, spec_policy="off", kv_cache_dtype=kv_dtype))
    llm = make_llm(
        kquant_gguf, kv_cache_dtype=kv_dtype, speculative_proposer="ngram", spec_policy="fixed:4"
    )
    alone = [greedy(llm, [p])[0] for p in PROMPTS]
    assert greedy(llm) == plain and alone == plain
    stats = llm.engine.stats()
    assert stats.spec_num_accepted_tokens_total > 0
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_a_16_bit_cache_keeps_greedy_parity_and_halves_the_bytes(
    kquant_gguf, float32_run, kv_dtype
):
    reference, want = float32_run
    llm = make_llm(kquant_gguf, spec_policy="off", kv_cache_dtype=kv_dtype)
    runner = llm.engine.runner
    assert runner.backend.kv_caches[0].dtype == getattr(torch, kv_dtype)
    assert runner.num_blocks == 2 * reference.engine.runner.num_blocks
    identical, ties, real = near_tie_report(reference, PROMPTS, greedy(llm), want, NEAR_TIE)
    assert not real, real
    assert identical + len(ties) == len(PROMPTS)


def test_an_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig.from_flat({"kv_cache_dtype": "int8"})
