"""Gemma 3 270M Q4_K_M (benchmarks/models/gemma3.sh): the config llama.cpp's rules give (5 sliding
layers of 512 positions per global one, local RoPE base 10000), and greedy tokens equal to
transformers' (which loads the GGUF dequantised to float32) on the float32 path and on the
native quantized path, including a prompt of ~950 tokens, past the sliding window. The native
path may part only where transformers' two best logits are within NEAR_TIE (tests/parity.py's
rule); gaps are printed (`pytest -s`)."""

from __future__ import annotations

import pytest
import torch

from engine.models.loader import load_model, read_arch_config
from engine.models.tokenizer import Tokenizer
from kernels.cpu.paged_attention import CpuPagedBackend
from kernels.reference import ReferenceBackend
from tests.engine.models import hf_gguf

pytestmark = [pytest.mark.heavy, pytest.mark.slow]

MAX_NEW_TOKENS = 16
NEAR_TIE = 1e-3
EOS, END_OF_TURN = 1, 106
TEXT_PROMPTS = ["The capital of France is", "def fibonacci(n):\n"]
LONG_PROMPT = " ".join(f"item {i}: apple" for i in range(150)) + " The list above names"


@pytest.fixture(scope="module")
def hf_tokenizer(gemma3_270m):
    return hf_gguf.hf_tokenizer(gemma3_270m)


@pytest.fixture(scope="module")
def hf_model(gemma3_270m):
    return hf_gguf.hf_model(gemma3_270m)


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return [hf_tokenizer.encode(p) for p in [*TEXT_PROMPTS, LONG_PROMPT]]


@pytest.fixture(scope="module")
def hf_outputs(hf_model, prompts) -> list[list[int]]:
    eos = (EOS, END_OF_TURN)
    return [hf_gguf.hf_greedy(hf_model, ids, eos, MAX_NEW_TOKENS) for ids in prompts]


def test_config_follows_llama_cpp(gemma3_270m):
    config = read_arch_config(gemma3_270m)
    assert config.layer_windows == ((512,) * 5 + (0,)) * 3
    assert (config.local_rope_theta, config.rope_theta) == (10000.0, 1e6)
    assert config.qk_norm and config.sandwich_norms and config.hidden_act == "gelu_tanh"
    assert config.query_pre_attn_scalar == config.head_dim == 256
    assert config.tie_word_embeddings and config.vocab_size == 262144
    assert config.eos_token_ids == (EOS, END_OF_TURN)


def test_a_prompt_runs_past_the_sliding_window(prompts):
    assert len(prompts[-1]) > 512


@pytest.mark.parametrize(
    "weights, backend", [("float32", ReferenceBackend), ("gguf", CpuPagedBackend)]
)
def test_greedy_equals_transformers(
    gemma3_270m, hf_model, hf_tokenizer, prompts, hf_outputs, models_helpers, weights, backend
):
    model, _ = load_model(gemma3_270m, torch.float32, "cpu", backend(), weights)
    ours = hf_gguf.our_greedy_batch(
        model, prompts, (EOS, END_OF_TURN), MAX_NEW_TOKENS, models_helpers.PagedDriver
    )
    for prompt_ids, got, want in zip(prompts, ours, hf_outputs, strict=True):
        parted = hf_gguf.first_divergence_gap(hf_model, prompt_ids, got, want)
        if parted is None:
            assert got == want
            print(f"{weights}: identical ({len(got)} tokens)")
            continue
        assert weights != "float32", (hf_tokenizer.decode(prompt_ids[-20:]), parted)
        print(f"{weights}: parts at token {parted[0]}: transformers' logit gap {parted[1]:.2e}")
        assert parted[1] < NEAR_TIE, (hf_tokenizer.decode(prompt_ids[-20:]), parted)


def test_chat_template_and_stop_tokens(gemma3_270m):
    """The file carries no chat template: Gemma's turn format is supplied (chat_templates.py)."""
    tokenizer = Tokenizer.from_path(gemma3_270m)
    ids = tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )
    assert tokenizer.convert_ids_to_tokens([EOS, END_OF_TURN]) == ["<eos>", "<end_of_turn>"]
