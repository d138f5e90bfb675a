"""The whole engine on a CUDA GPU with FlashInfer (marked gpu; skipped without CUDA/flashinfer).

A tiny random Llama with FlashInfer-sized heads (head_dim 64) and peaked next-token laws
(initializer_range 0.3), in bfloat16. Checked through LLM.generate, greedy:
  * decode CUDA graphs (batch padded to a captured size) give the eager run's tokens;
  * FlashInfer gives the reference backend's tokens (both bfloat16);
  * n-gram and Token Recycling speculation, chains and trees (FlashInfer's custom mask), give
    the tokens of plain decoding, with drafts accepted and the KV pool whole afterwards.
"Gives the tokens" allows one thing only: a first difference at a near-tie, where the baseline
run's own engine scores the two candidates within NEAR_TIE of each other (tests/parity.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.conftest import build_tiny_llama
from tests.parity import near_tie_report

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

NEAR_TIE = 0.25  # logprob gap; bf16 logits of this model are ~N(0, 5), kernel noise ~0.05
NEW_TOKENS = 48
GREEDY = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
BASE = dict(
    device="cuda",
    dtype="bfloat16",
    attention_backend="flashinfer",
    num_kv_blocks=256,
    spec_profile_seconds=0,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_llama(
        tmp_path_factory.mktemp("tiny-hd64"),
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.3,
    )


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    """Six prompts (a batch padded to the captured size 8): four repeat a random phrase, so
    n-gram drafts find matches; two are random."""
    rng = random.Random(0)
    out = []
    for i in range(6):
        phrase = [rng.randrange(3, 256) for _ in range(rng.randint(5, 9))]
        out.append(phrase * rng.randint(3, 5) if i < 4 else phrase * 4)
        if i >= 4:
            rng.shuffle(out[-1])
    return out


def make_llm(model_dir: Path, **flat) -> LLM:
    return LLM(config=EngineConfig.from_flat({"model": str(model_dir), **BASE, **flat}))


@pytest.fixture(scope="module")
def plain(model_dir, prompts) -> tuple[LLM, list[list[int]]]:
    """FlashInfer with decode graphs, no speculation: the engine and its greedy tokens."""
    llm = make_llm(model_dir)
    assert llm.engine.runner.graphs is not None
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.runner.graphs.num_replays >= NEW_TOKENS - 1
    assert_pool_whole(llm)
    return llm, [o.output_token_ids for o in outputs]


def assert_pool_whole(llm: LLM) -> None:
    stats = llm.engine.stats()
    assert not llm.engine.has_unfinished_requests()
    assert stats.num_free_blocks == stats.num_total_blocks, "KV blocks leaked"


def assert_same_or_near_tie(judge: LLM, prompts, got, want) -> None:
    identical, ties, real = near_tie_report(judge, prompts, got, want, NEAR_TIE)
    assert not real, f"diverged beyond a near-tie: {real}"
    assert identical >= len(prompts) - 1, f"only {identical} identical; near-ties: {ties}"


def test_cuda_graphs_match_eager(model_dir, prompts, plain):
    eager = make_llm(model_dir, cuda_graphs=False)
    assert eager.engine.runner.graphs is None
    outputs = eager.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_or_near_tie(plain[0], prompts, [o.output_token_ids for o in outputs], plain[1])


def test_flashinfer_matches_reference_backend(model_dir, prompts, plain):
    reference = make_llm(model_dir, attention_backend="reference")
    outputs = reference.generate(prompts, GREEDY, use_tqdm=False)
    want = [o.output_token_ids for o in outputs]
    assert_same_or_near_tie(reference, prompts, plain[1], want)


@pytest.mark.parametrize("proposer", ["ngram", "recycle"])
@pytest.mark.parametrize("tree_nodes", [0, 6], ids=["chain", "tree"])
def test_speculation_matches_plain_decoding(model_dir, prompts, plain, proposer, tree_nodes):
    k = tree_nodes or 3
    llm = make_llm(
        model_dir,
        speculative_proposer=proposer,
        spec_policy=f"fixed:{k}",
        num_speculative_tokens=k,
        spec_tree_nodes=tree_nodes,
    )
    outputs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert_same_or_near_tie(plain[0], prompts, [o.output_token_ids for o in outputs], plain[1])
    stats = llm.engine.stats()
    assert stats.spec_num_accepted_tokens_total > 0
    assert_pool_whole(llm)
    graphs = llm.engine.runner.graphs
    if tree_nodes:  # tree steps carry masks: decode graphs only
        assert graphs.shapes.max_query_len == 1
    else:  # every step after the one prefill step replays, verification included
        assert graphs.shapes.max_query_len == k + 1
        assert graphs.num_replays >= stats.num_steps_total - 1
