"""Sampled output under a grammar with speculation on follows the exact masked law.

The tiny Markov-leaning Llama of test_spec_tiny.py gets a 32-token character tokenizer
(<pad> <s> </s> and 29 characters). Requests ask for `[a-d]{3}` at temperature 1 with n-gram
drafts copied from a prompt of those letters (sampled from the masked law itself): drafts are accepted, rejected, and cut where the
grammar refuses them (a 4th letter). The exact law of the three letters is the product of the
model's float64 softmax restricted to {a, b, c, d} at each depth (HF transformers, over all
1 + 4 + 16 prefixes); a chi-square test compares NUM_REQUESTS seeded samples with it (here: acceptance 0.41,
46 degrees of freedom, p = 0.05; deterministic given the seeds).
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import GuidedDecoding, SamplingParams
from tests.e2e.test_spec_tiny import ATTENTION_SCALE, VOCAB, build_markov_leaning_llama
from tests.stats import chi_square

TEMPERATURE = 1.0
NUM_REQUESTS = 4000
ALPHA = 1e-3
LETTERS = "abcd"
CHARS = "abcdefghijklmnopqrstuvwxyz012"  # ids 3..31


def save_tokenizer_32(path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, **{c: i + 3 for i, c in enumerate(CHARS)}}
    assert len(vocab) == VOCAB
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<pad>"
    ).save_pretrained(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = build_markov_leaning_llama(tmp_path_factory.mktemp("tiny-grammar-v32"))
    save_tokenizer_32(path)
    return path


def letter_ids() -> list[int]:
    return [CHARS.index(c) + 3 for c in LETTERS]


@pytest.fixture(scope="module")
def reference(model_dir):
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir).double().eval()


def sample_prompt(model, length: int = 24) -> list[int]:
    """A seeded sample of the masked law itself, so its n-grams recur with the model's own
    continuations (drafts then get accepted as well as rejected)."""
    generator = torch.Generator().manual_seed(0)
    allowed = torch.tensor(letter_ids())
    token_ids = [allowed[0].item()]
    with torch.no_grad():
        while len(token_ids) < length:
            logits = model(torch.tensor([token_ids])).logits[0, -1, allowed]
            probs = torch.softmax(logits / TEMPERATURE, dim=-1)
            token_ids.append(int(allowed[torch.multinomial(probs, 1, generator=generator)]))
    return token_ids


def exact_law(model, prompt: list[int]) -> torch.Tensor:
    """P(letters = (x, y, z)) over {a..d}^3, index x*16 + y*4 + z, float64."""
    allowed = torch.tensor(letter_ids())
    joint = torch.ones(1, dtype=torch.float64)
    prefixes = torch.zeros(1, 0, dtype=torch.long)
    with torch.no_grad():
        for _ in range(3):
            inputs = torch.cat([torch.tensor([prompt]).expand(len(prefixes), -1), prefixes], 1)
            logits = model(inputs).logits[:, -1, allowed]
            joint = (joint[:, None] * torch.softmax(logits / TEMPERATURE, -1)).reshape(-1)
            tokens = allowed.repeat(len(prefixes))[:, None]
            prefixes = torch.cat([prefixes.repeat_interleave(len(allowed), 0), tokens], 1)
    return joint


def test_sampled_output_under_a_grammar_matches_the_masked_law(model_dir, reference):
    assert ATTENTION_SCALE < 1  # the model whose n-grams recur (see test_spec_tiny.py)
    prompt = sample_prompt(reference)
    config = EngineConfig.from_flat(dict(
        model=str(model_dir), num_kv_blocks=2048, max_num_seqs=256, threads=1,
        max_num_batched_tokens=16384, proposer="ngram", spec_policy="fixed:3",
        num_speculative_tokens=3,
    ))  # fmt: skip
    llm = LLM(config=config)
    guided = GuidedDecoding("regex", f"[{LETTERS}]{{3}}")
    params = [
        SamplingParams(temperature=TEMPERATURE, seed=seed, max_tokens=5, guided=guided)
        for seed in range(NUM_REQUESTS)
    ]
    outputs = llm.generate([prompt] * NUM_REQUESTS, params, use_tqdm=False)
    index = {t: i for i, t in enumerate(letter_ids())}
    counts = torch.zeros(64, dtype=torch.float64)
    for output in outputs:
        assert output.finish_reason == "stop" and len(output.output_token_ids) == 4  # + EOS
        x, y, z = (index[t] for t in output.output_token_ids[:3])
        counts[x * 16 + y * 4 + z] += 1
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
    assert stats.spec_num_drafts_total > NUM_REQUESTS // 2
    acceptance = stats.spec_num_accepted_tokens_total / stats.spec_num_draft_tokens_total
    assert 0.05 < acceptance < 0.95
    statistic, dof, p_value = chi_square(counts, exact_law(reference, prompt))
    assert p_value > ALPHA, f"chi2={statistic:.1f} dof={dof} p={p_value:.2e}"
