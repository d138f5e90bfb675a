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
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(draft_path.parent, gguf_file=draft_path.name)


@pytest.fixture(scope="module")
def hf_model(draft_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        draft_path.parent, gguf_file=draft_path.name, dtype=torch.float32
    )
    return model.eval()


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> list[list[int]]:
    chats = [
        hf_tokenizer.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for p in CHAT_PROMPTS
    ]
    return [list(ids) for ids in chats] + [hf_tokenizer.encode(p) for p in TEXT_PROMPTS]


@pytest.fixture(scope="module")
def hf_outputs(hf_model, prompts) -> list[list[int]]:
    outputs = []
    for ids in prompts:
        with torch.no_grad():
            out = hf_model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                do_sample=False,
                max_new_tokens=MAX_NEW_TOKENS,
                eos_token_id=[IM_END, END_OF_TEXT],
                pad_token_id=END_OF_TEXT,
            )
        outputs.append(out[0, len(ids) :].tolist())
    return outputs


def our_greedy(model, prompts, driver_class) -> list[list[int]]:
    """All prompts prefilled in one step, then decoded together until EOS or the limit."""
    driver = driver_class(model, num_blocks=64, block_size=16)
    chunks = {str(i): ids for i, ids in enumerate(prompts)}
    outputs: dict[str, list[int]] = {rid: [] for rid in chunks}
    while chunks:
        logits = driver.step(chunks)
        chunks = {}
        for rid, rows in logits.items():
            outputs[rid].append(int(rows[-1].argmax()))
            if outputs[rid][-1] not in (IM_END, END_OF_TEXT):
                if len(outputs[rid]) < MAX_NEW_TOKENS:
                    chunks[rid] = outputs[rid][-1:]
    return [outputs[str(i)] for i in range(len(prompts))]


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
        index = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if index is None:
            assert got == want, hf_tokenizer.decode(prompt_ids)  # not one stopping early
            print(f"identical ({len(got)} tokens)")
            continue
        with torch.no_grad():
            logits = hf_model(torch.tensor([[*prompt_ids, *want[:index]]])).logits[0, -1]
        gap = float(logits[want[index]] - logits[got[index]])
        print(f"parts at token {index}: transformers' logit gap {gap:.2e}")
        assert gap < NEAR_TIE, (hf_tokenizer.decode(prompt_ids), index, gap)


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
