"""Sampled speculative decoding is lossless through the whole engine (DESIGN §5), on a tiny model.

The exact joint law of the first NUM_MEASURED generated tokens is computed from the model with
HF transformers in float64 (one batched forward per depth over all 1 + V + V**2 prefixes). The engine then
serves NUM_REQUESTS requests for the same prompt, each with its own seed, with n-gram drafts
(chains and trees; q is a point mass, so rejections go through the residual). A chi-square
goodness-of-fit test compares the empirical joint with the exact one at significance ALPHA.
The engine is deterministic given the seeds, so each test either always passes or always fails.

The first token is always sampled plainly (speculation starts once a request has caught up);
tokens 2 and 3 come from verification steps. The engine caps a step's drafts (chain tokens or
tree nodes) at the remaining output budget minus the bonus token, so each case asks for a few
more tokens than it measures: the step after the first token verifies up to max_tokens - 2.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.outputs import EngineStats
from engine.sampling_params import SamplingParams
from tests.conftest import build_tiny_llama
from tests.stats import chi_square, joint_counts

VOCAB = 32
TEMPERATURE = 0.5
NUM_REQUESTS = 20_000
NUM_MEASURED = 3  # tokens whose joint law is tested
K = 3
TREE_NODES = 6  # ~half of the n-gram trees branch (3 nodes: < 10%; the budget goes deep first)
ALPHA = 1e-3  # significance: a correct engine fails with probability 1e-3 per test (seed-fixed)
PROMPT_LEN = 32
ATTENTION_SCALE = 0.01

# Flat config + max_tokens per request (max_tokens - 2 = the draft budget of the first verify).
CHAIN = dict(spec_policy=f"fixed:{K}", spec_tree_nodes=0, max_tokens=K + 2)
TREE = dict(
    spec_policy=f"fixed:{TREE_NODES}", spec_tree_nodes=TREE_NODES, max_tokens=TREE_NODES + 2
)


def build_markov_leaning_llama(path: Path) -> Path:
    """A tiny random Llama whose next-token law depends mostly on the last token.

    With initializer_range 0.3 the laws are peaked (top probability ~0.3-0.9). Attention is
    kept but its output projection is scaled by ATTENTION_SCALE: with full attention a random
    model's law swings with every context token, so n-gram drafts (copied from the context)
    are accepted < 5% of the time; here ~45%, at every depth, so the accept, reject, bonus
    and sibling paths of verification are all exercised thousands of times. The KV cache and
    tree attention masks are proven by the greedy real-model tests (test_spec_lossless.py).
    """
    build_tiny_llama(path, vocab_size=VOCAB, initializer_range=0.3)
    weights_path = path / "model.safetensors"
    weights = load_file(weights_path)
    for name in weights:
        if name.endswith("o_proj.weight"):
            weights[name] = weights[name] * ATTENTION_SCALE
    save_file(weights, weights_path, metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny ops on 2 intra-op threads are ~50x slower on a busy 2-core machine (thread
    hand-off dominates); the engine below runs with threads=1 too."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_markov_leaning_llama(tmp_path_factory.mktemp("tiny-llama-v32"))


@pytest.fixture(scope="module")
def reference(model_dir):
    """The model in float64 through HF transformers: the independent ground truth."""
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir).double().eval()


@pytest.fixture(scope="module")
def prompt(reference) -> list[int]:
    """A seeded sample from the model itself, so its n-grams recur with the model's own
    continuations (and several continuations each: n-gram trees branch)."""
    generator = torch.Generator().manual_seed(0)
    token_ids = [5]
    with torch.no_grad():
        while len(token_ids) < PROMPT_LEN:
            logits = reference(torch.tensor([token_ids])).logits[0, -1]
            probs = torch.softmax(logits / TEMPERATURE, dim=-1)
            token_ids.append(int(torch.multinomial(probs, 1, generator=generator)))
    return token_ids


@pytest.fixture(scope="module")
def exact_joint(reference, prompt) -> torch.Tensor:
    return exact_joint_law(reference, prompt)


def exact_joint_law(reference, prompt: list[int]) -> torch.Tensor:
    """P(first NUM_MEASURED tokens = (a, b, c)) flattened to [VOCAB**3] (index a*V*V + b*V + c),
    float64: one batched forward per depth over every prefix of that depth."""
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = torch.zeros(1, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(NUM_MEASURED):
            inputs = torch.cat([torch.tensor([prompt]).expand(len(prefixes), -1), prefixes], 1)
            logits = reference(inputs).logits[:, -1]
            step = torch.softmax(logits / TEMPERATURE, dim=-1)  # [num_prefixes, VOCAB]
            joint = (joint[:, None] * step).reshape(-1)
            tokens = torch.arange(VOCAB).repeat(len(prefixes))[:, None]
            prefixes = torch.cat([prefixes.repeat_interleave(VOCAB, 0), tokens], 1)
    return joint


def run_engine(
    model_dir: Path, prompt: list[int], max_tokens: int, num_requests: int = NUM_REQUESTS, **spec
) -> tuple[torch.Tensor, EngineStats]:
    """Counts of the first NUM_MEASURED tokens over num_requests seeded requests, and stats."""
    config = EngineConfig.from_flat(
        dict(
            model=str(model_dir),
            dtype="float32",
            num_kv_blocks=2048,
            max_num_seqs=256,
            max_num_batched_tokens=16384,
            threads=1,
            speculative_proposer="ngram",
            **spec,
        )
    )
    llm = LLM(config=config)
    params = [
        SamplingParams(temperature=TEMPERATURE, seed=seed, max_tokens=max_tokens, ignore_eos=True)
        for seed in range(num_requests)
    ]
    outputs = llm.generate([prompt] * num_requests, params, use_tqdm=False)
    counts = joint_counts([o.output_token_ids for o in outputs], VOCAB, NUM_MEASURED)
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks  # no KV block leaked
    return counts, stats


def test_chi_square_rejects_a_slightly_wrong_law(exact_joint):
    """The check's power at NUM_REQUESTS samples: moving 6% of the probability mass onto the
    most likely outcome (p ~ 0.35) is rejected (3% is borderline), the exact law is not."""
    generator = torch.Generator().manual_seed(0)
    top = int(exact_joint.argmax())
    shifted = exact_joint.clone()
    shifted[top] += 0.06
    shifted /= shifted.sum()
    draws = torch.multinomial(shifted, NUM_REQUESTS, replacement=True, generator=generator)
    counts = torch.bincount(draws, minlength=len(exact_joint)).double()
    assert chi_square(counts, exact_joint)[2] < ALPHA
    draws = torch.multinomial(exact_joint, NUM_REQUESTS, replacement=True, generator=generator)
    counts = torch.bincount(draws, minlength=len(exact_joint)).double()
    assert chi_square(counts, exact_joint)[2] > ALPHA


@pytest.mark.parametrize("spec", [CHAIN, TREE], ids=["chain", "tree"])
def test_ngram_sampling_matches_exact_law(model_dir, prompt, exact_joint, spec):
    counts, stats = run_engine(model_dir, prompt, **spec)
    # Speculation must really happen, and both branches of the rule (accept, reject) be taken.
    assert stats.spec_num_drafts_total > NUM_REQUESTS // 2
    acceptance = stats.spec_num_accepted_tokens_total / stats.spec_num_draft_tokens_total
    assert 0.05 < acceptance < 0.95
    assert len(stats.spec_accepted_per_position_total) >= 2  # paths deeper than one draft
    statistic, dof, p_value = chi_square(counts, exact_joint)
    assert p_value > ALPHA, f"chi2={statistic:.1f} dof={dof} p={p_value:.2e}"


def test_planted_acceptance_bug_is_caught(model_dir, prompt, exact_joint, monkeypatch):
    """The same check has power through the engine: with every chain's first draft accepted
    whatever the target says (a classic bug), even a tenth of the requests fail it by far."""
    import engine.sample.batch_verify as batch_verify
    from engine.sample.verify import VerifyResult, verify_chain

    def accept_first(targets, drafts):
        if not drafts:
            return verify_chain(targets, drafts)
        rest = verify_chain(targets[1:], drafts[1:])
        nodes = (0, *(1 + node for node in rest.accepted_node_ids))
        return VerifyResult((drafts[0], *rest.token_ids), nodes)

    monkeypatch.setattr(batch_verify, "verify_chain", accept_first)
    counts, _ = run_engine(model_dir, prompt, num_requests=NUM_REQUESTS // 10, **CHAIN)
    assert chi_square(counts, exact_joint)[2] < ALPHA
