"""Sampled losslessness of draft-model speculation through the whole engine (statistical).

Set-up: a tiny random Llama with VOCAB = 16 tokens (weights initialised wide enough that its
next-token distributions are peaked, not uniform) is the target; a noisy copy of it is the
draft (its drafts are accepted about half the time). NUM_REQUESTS requests with seeds 0, 1, ...
sample MAX_TOKENS tokens after PROMPT at TEMPERATURE. The first token comes from the prefill
step; the next ones from draft chains of 2 (or trees of 2 nodes: two siblings or a path)
verified by the engine. The
counts of the first NUM_MEASURED tokens (VOCAB ** 3 outcomes) are compared with their exact
law under the target, computed with transformers by enumerating every prefix, by Pearson's
chi-square goodness-of-fit test: outcomes expected fewer than MIN_EXPECTED times are pooled
into one bin, and the p-value is the chi-square survival function Q(dof / 2, stat / 2).

Lossless runs must give p > ALPHA (fixed seeds make each run repeatable; a correct engine
fails one such test with probability ALPHA). The planted bug (the verifier's target tokens
taken as the target's argmax instead of its sample, so accepted drafts are judged against the
wrong token) must give p < BUG_ALPHA, which shows the check can fail.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams
from tests.conftest import build_tiny_llama
from tests.engine.speculation.proposers.test_draft_model import noisy_copy
from tests.stats import chi_square_pvalue, joint_counts

VOCAB = 16
PROMPT = [5]
TEMPERATURE = 0.8
NUM_MEASURED = 3
NUM_REQUESTS = 20_000
ALPHA = 1e-3
BUG_ALPHA = 1e-6
MAX_TOKENS = 4  # after the first token, up to 2 drafts fit: chains of 2, trees of 2 nodes
MODES = {
    "chain": dict(num_speculative_tokens=2, spec_policy="fixed:2"),
    "tree": dict(spec_tree_nodes=2, spec_policy="fixed:2"),
}


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()  # engines below set one thread process-wide
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple:
    target = build_tiny_llama(
        tmp_path_factory.mktemp("target16"), vocab_size=VOCAB, initializer_range=0.2
    )
    return target, noisy_copy(target, tmp_path_factory.mktemp("draft16"), 0.03)


@pytest.fixture(scope="module")
def exact_probs(models) -> torch.Tensor:
    """[VOCAB ** NUM_MEASURED] float64: the target's law of the first NUM_MEASURED tokens."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(models[0]).eval().double()
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = torch.zeros(1, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(NUM_MEASURED):
            inputs = torch.cat([torch.tensor([PROMPT]).expand(len(prefixes), -1), prefixes], 1)
            step = torch.softmax(model(inputs).logits[:, -1] / TEMPERATURE, dim=-1)
            joint = (joint[:, None] * step).reshape(-1)  # index = prefix * VOCAB + token
            tokens = torch.arange(VOCAB).repeat(len(prefixes))[:, None]
            prefixes = torch.cat([prefixes.repeat_interleave(VOCAB, 0), tokens], 1)
    return joint


def make_llm(models, mode: str) -> LLM:
    config = dict(
        model=str(models[0]),
        num_kv_blocks=4096,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        threads=1,
        speculative_proposer="draft",
        draft_model=str(models[1]),
        **MODES[mode],
    )
    return LLM(config=EngineConfig.from_flat(config))


def sample_counts(llm: LLM, num_requests: int) -> torch.Tensor:
    """Counts [VOCAB ** NUM_MEASURED] of the first tokens of num_requests seeded requests."""
    params = [
        SamplingParams(temperature=TEMPERATURE, seed=seed, max_tokens=MAX_TOKENS, ignore_eos=True)
        for seed in range(num_requests)
    ]
    outputs = llm.generate([PROMPT] * num_requests, params, use_tqdm=False)
    counts = joint_counts([o.output_token_ids for o in outputs], VOCAB, NUM_MEASURED)
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks  # no KV block leaked
    return counts


@pytest.mark.slow  # ~35-50 s each on a shared 2-core CPU
@pytest.mark.parametrize("mode", MODES)
def test_sampled_draft_speculation_matches_the_target(models, exact_probs, mode):
    llm = make_llm(models, mode)
    counts = sample_counts(llm, NUM_REQUESTS)
    stats = llm.engine.stats()
    # Speculation really happened, and drafts were neither always nor never accepted.
    assert stats.spec_num_drafts_total > NUM_REQUESTS // 2
    assert 0.1 < stats.spec_num_accepted_tokens_total / stats.spec_num_draft_tokens_total < 0.9
    assert chi_square_pvalue(counts, exact_probs) > ALPHA


@pytest.mark.slow
def test_check_rejects_targets_that_are_not_samples_from_p(models, exact_probs):
    llm = make_llm(models, "chain")
    verifier_sampler = llm.engine.runner.verifier.sampler

    def argmax(probs, keys):  # planted bug: the target's mode stands in for its sample
        return probs.argmax(dim=-1)

    verifier_sampler.sample = argmax
    counts = sample_counts(llm, NUM_REQUESTS // 4)
    assert chi_square_pvalue(counts, exact_probs) < BUG_ALPHA
