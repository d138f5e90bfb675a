"""SmolLM2-135M-Instruct (the embedded GGUF): our greedy tokens equal transformers'.

One load of each model for the module. Our side runs all prompts as one paged batch (a
six-chunk prefill, then ragged decode batches that shrink as requests hit EOS), so batching
and block tables are exercised on the real model; transformers runs each prompt alone.
The float32 path (weights dequantised at load, as transformers does) must match exactly. The
quantized path (the GGUF's blocks on the native CPU kernels: same weights, other summation
order) must match too, or part ways only where transformers' two best logits are within
NEAR_TIE of each other.
"""

from __future__ import annotations

import pytest
import torch

from engine.models.linear import QuantLinear
from engine.models.loader import load_model, read_arch_config
from engine.models.tokenizer import Tokenizer
from kernels.reference import ReferenceBackend
from tests.engine.models import hf_gguf

pytestmark = pytest.mark.slow

MAX_NEW_TOKENS = 64
NEAR_TIE = 1e-4  # logit gap under which float32 summation order may flip a greedy choice
CHAT_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in detail how a bicycle works.",
]
TEXT_PROMPTS = [
    "Once upon a time, in a small village,",
    "def fibonacci(n):\n",
    "The three most important inventions of the 20th century are",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: batch-1 decode is memory-bound (as fast as two on an idle 2-core
    machine), and on a busy one two OpenMP threads spin against each other (HF generate fell
    from 8 to 1.5 tok/s here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path):
    return hf_gguf.hf_tokenizer(smollm2_path)


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    return hf_gguf.hf_model(smollm2_path)


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    return hf_gguf.encode_prompts(hf_tokenizer, CHAT_PROMPTS, TEXT_PROMPTS)


@pytest.fixture(scope="module")
def eos_ids(smollm2_path) -> tuple[int, ...]:
    return read_arch_config(smollm2_path).eos_token_ids[:1]


@pytest.fixture(scope="module")
def hf_outputs(hf_model, prompts, eos_ids) -> list[list[int]]:
    return [hf_gguf.hf_greedy(hf_model, ids, eos_ids, MAX_NEW_TOKENS) for ids in prompts]


def our_greedy(model, prompts, eos_ids, models_helpers) -> list[list[int]]:
    driver = models_helpers.PagedDriver
    return hf_gguf.our_greedy_batch(model, prompts, eos_ids, MAX_NEW_TOKENS, driver)


def test_greedy_tokens_equal_transformers(
    smollm2_path, hf_tokenizer, prompts, eos_ids, hf_outputs, models_helpers
):
    model, _ = load_model(smollm2_path, torch.float32, "cpu", ReferenceBackend(), "float32")
    ours = our_greedy(model, prompts, eos_ids, models_helpers)
    for prompt_ids, our_ids, expected in zip(prompts, ours, hf_outputs, strict=True):
        assert our_ids == expected, hf_tokenizer.decode(prompt_ids)
    assert "Paris" in hf_tokenizer.decode(ours[0])
    assert sum(len(ids) for ids in ours) > 3 * MAX_NEW_TOKENS  # long enough to mean something


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_quantized_path_tokens_equal_transformers_or_part_at_near_ties(
    smollm2_path, hf_model, hf_tokenizer, prompts, eos_ids, hf_outputs, models_helpers, backend
):
    """On the reference attention (per-op forward) and on the engine's default CPU path (the
    native attention and decoder stack)."""
    model, _ = load_model(smollm2_path, torch.float32, "cpu", make_backend(backend), "gguf")
    assert isinstance(model.layers[0].mlp.gate_up_proj, QuantLinear)
    assert isinstance(model.lm_head, QuantLinear)
    ours = our_greedy(model, prompts, eos_ids, models_helpers)
    for prompt_ids, got, want in zip(prompts, ours, hf_outputs, strict=True):
        parted = hf_gguf.first_divergence_gap(hf_model, prompt_ids, got, want)
        if parted is None:
            assert got == want, hf_tokenizer.decode(prompt_ids)  # not one stopping early
            continue
        assert parted[1] < NEAR_TIE, (hf_tokenizer.decode(prompt_ids), parted)
    assert "Paris" in hf_tokenizer.decode(ours[0])


def make_backend(name: str):
    from kernels.cpu.paged_attention import CpuPagedBackend

    return ReferenceBackend() if name == "reference" else CpuPagedBackend()


@pytest.mark.parametrize("weights", ["gguf", "gguf-int8"])  # int16 (the default), int8
def test_quantized_path_is_batch_invariant_on_the_real_model(smollm2_path, models_helpers, weights):
    """A request's logits are bitwise the same alone and batched with another request (its
    prefill next to another prefill, its decodes next to a 3-token verify-like chunk)."""
    model, _ = load_model(smollm2_path, torch.float32, "cpu", ReferenceBackend(), weights)
    a, b, tokens = [1, 504, 3458, 282, 4649, 314, 260, 905], [1, 28, 1156, 88, 344], (11, 12, 13)
    # One driver at a time: drivers share the model's backend and its KV cache.
    alone = models_helpers.PagedDriver(model, num_blocks=64, block_size=16)
    expected = [alone.step({"a": a})["a"]] + [alone.step({"a": [t]})["a"] for t in tokens]
    batched = models_helpers.PagedDriver(model, num_blocks=64, block_size=16)
    got = [batched.step({"b": b, "a": a})["a"]]
    got += [batched.step({"a": [t], "b": [7, 8, 9]})["a"] for t in tokens]
    for step, (want, have) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(want, have), step


@pytest.mark.parametrize("source", ["converted", "cached"])
def test_tokenizer_matches_transformers(hf_tokenizer, tmp_path_factory, monkeypatch, source):
    """Both the GGUF conversion and its cached copy behave like transformers' tokenizer."""
    monkeypatch.setenv("GOODSPEED_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tok-cache"))
    tokenizer = Tokenizer.from_path("smollm2-135m-instruct")
    if source == "cached":
        assert any((tmp_path_factory.getbasetemp() / "tok-cache" / "tokenizers").iterdir())
        tokenizer = Tokenizer.from_path("smollm2-135m-instruct")
    for text in [*TEXT_PROMPTS, "Hello world", "  spaces\tand\nnewlines  ", "émoji 🙂 ünïcode"]:
        assert tokenizer.encode(text) == hf_tokenizer.encode(text)
        assert tokenizer.decode(tokenizer.encode(text)) == text
    # SmolLM2 adds no BOS by default; the chat template writes <|im_start|> itself.
    assert tokenizer.encode("Hello") == tokenizer.encode("Hello", add_special_tokens=False)
    messages = [{"role": "user", "content": CHAT_PROMPTS[0]}]
    expected = hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert tokenizer.apply_chat_template(messages) == list(expected)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.vocab_size) == (1, 2, 49152)
    assert tokenizer.convert_ids_to_tokens([1, 2]) == ["<|im_start|>", "<|im_end|>"]
    assert tokenizer.decode([1, 19556, 2]) == "Hello"
