"""The Qwen2.5-Coder pair (benchmarks/models/qwen_pair.sh): both GGUFs load as qwen2, every
linear weight and the embedding run natively, and the 0.5B's greedy tokens equal transformers'.

transformers loads the GGUF dequantised to float32 (as our `--weights float32` path does), so
that path must match it token for token. The quantized path runs the same weights (the
kernels' dequantisation is bit-exact) in another summation order: it must match too, or part
ways only where transformers' two best logits are within NEAR_TIE (tests/parity.py's rule).
The gaps are printed (`pytest -s`) so a run reports the margins.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.linear import QuantEmbedding, QuantLinear
from engine.models.loader import load_model, read_arch_config
from engine.models.tokenizer import Tokenizer
from kernels.reference import ReferenceBackend
from tests.engine.models import hf_gguf

pytestmark = [pytest.mark.heavy, pytest.mark.slow]

MAX_NEW_TOKENS = 32
NEAR_TIE = 1e-3  # float32 logit gap under which summation order may flip a greedy choice
CHAT_PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "What is the difference between a list and a tuple in Python?",
]
TEXT_PROMPTS = ["def quicksort(items):\n"]
IM_END, END_OF_TEXT = 151645, 151643


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def draft_path(qwen_pair):
    return qwen_pair[1]


@pytest.fixture(scope="module")
def hf_tokenizer(draft_path):
    return hf_gguf.hf_tokenizer(draft_path)


@pytest.fixture(scope="module")
def hf_model(draft_path):
    return hf_gguf.hf_model(draft_path)


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return hf_gguf.encode_prompts(hf_tokenizer, CHAT_PROMPTS, TEXT_PROMPTS)


@pytest.fixture(scope="module")
def hf_outputs(hf_model, prompts) -> list[list[int]]:
    eos = (IM_END, END_OF_TEXT)
    return [hf_gguf.hf_greedy(hf_model, ids, eos, MAX_NEW_TOKENS) for ids in prompts]


def our_greedy(model, prompts, driver_class) -> list[list[int]]:
    eos = (IM_END, END_OF_TEXT)
    return hf_gguf.our_greedy_batch(model, prompts, eos, MAX_NEW_TOKENS, driver_class)


def test_both_files_are_qwen2_and_run_natively(qwen_pair):
    for path, layers, hidden in zip(qwen_pair, (28, 24), (1536, 896), strict=True):
        config = read_arch_config(path)
        assert (config.num_layers, config.hidden_size, config.vocab_size) == (
            layers,
            hidden,
            151936,
        )
        assert config.attention_bias and not config.attention_out_bias
        assert not config.tie_word_embeddings  # both files store output.weight
        assert config.rope_theta == 1e6 and config.rope_scaling is None
        assert config.eos_token_ids == (IM_END, END_OF_TEXT)
    model, _ = load_model(qwen_pair[1], torch.float32, "cpu", ReferenceBackend(), "gguf")
    linears = [model.lm_head] + [m for layer in model.layers for m in layer.modules()]
    linears = [m for m in linears if hasattr(m, "out_features")]
    assert linears and all(isinstance(m, QuantLinear) for m in linears)
    assert isinstance(model.embed_tokens, QuantEmbedding)
    # 896 is not a multiple of 256: llama.cpp stored most 896-wide rows as Q5_0, v as Q8_0.
    assert "Q5_0" in repr(model.layers[0].self_attn.qkv_proj)


def test_float32_path_equals_transformers(draft_path, prompts, hf_outputs, models_helpers):
    model, _ = load_model(draft_path, torch.float32, "cpu", ReferenceBackend(), "float32")
    ours = our_greedy(model, prompts, models_helpers.PagedDriver)
    assert ours == hf_outputs
    assert sum(len(ids) for ids in ours) >= 2 * MAX_NEW_TOKENS


def test_quantized_path_equals_transformers_or_parts_at_near_ties(
    draft_path, hf_model, hf_tokenizer, prompts, hf_outputs, models_helpers
):
    model, _ = load_model(draft_path, torch.float32, "cpu", ReferenceBackend(), "gguf")
    ours = our_greedy(model, prompts, models_helpers.PagedDriver)
    for prompt_ids, got, want in zip(prompts, ours, hf_outputs, strict=True):
        parted = hf_gguf.first_divergence_gap(hf_model, prompt_ids, got, want)
        if parted is None:
            assert got == want, hf_tokenizer.decode(prompt_ids)  # not one stopping early
            print(f"identical ({len(got)} tokens)")
            continue
        print(f"parts at token {parted[0]}: transformers' logit gap {parted[1]:.2e}")
        assert parted[1] < NEAR_TIE, (hf_tokenizer.decode(prompt_ids), parted)


def test_tokenizer_and_chat_template_match_transformers(draft_path, hf_tokenizer, prompts):
    tokenizer = Tokenizer.from_path(draft_path)
    for text in [*TEXT_PROMPTS, "Hello world", "  spaces\tand\nnewlines  ", "émoji 🙂 ünïcode"]:
        assert tokenizer.encode(text) == hf_tokenizer.encode(text)
        assert tokenizer.decode(tokenizer.encode(text)) == text
    messages = [{"role": "user", "content": CHAT_PROMPTS[0]}]
    assert tokenizer.apply_chat_template(messages) == prompts[0]
    assert tokenizer.convert_ids_to_tokens([IM_END, END_OF_TEXT]) == ["<|im_end|>", "<|endoftext|>"]
    assert tokenizer.convert_ids_to_tokens(prompts[0][:1]) == ["<|im_start|>"]
    assert tokenizer.vocab_size == 151936  # 151,665 real tokens, padded like the embedding
