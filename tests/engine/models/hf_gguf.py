"""transformers as the reference for a real GGUF, and our greedy decoding to compare with it.

Shared by the SmolLM2 and Qwen parity tests: transformers loads the GGUF dequantised to float32
(`from_pretrained(dir, gguf_file=name)`), runs each prompt alone, greedy; our side runs all
prompts as one paged batch (tests/engine/models/conftest.py's PagedDriver), then decodes them
together until an EOS id or the limit. A divergence on the quantized path is judged by
transformers' own logit gap between its token and ours at that point.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch


def hf_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval()


def encode_prompts(tokenizer, chat: Sequence[str], text: Sequence[str]) -> list[list[int]]:
    """Chat prompts through the chat template (generation prompt added), then plain texts."""
    chats = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        for p in chat
    ]
    return [list(ids) for ids in chats] + [tokenizer.encode(p) for p in text]


def hf_greedy(model, prompt_ids: list[int], eos_ids: Sequence[int], max_new: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=max_new,
            eos_token_id=list(eos_ids),
            pad_token_id=eos_ids[-1],
        )
    return out[0, len(prompt_ids) :].tolist()


def our_greedy_batch(
    model, prompts: list[list[int]], eos_ids: Sequence[int], max_new: int, driver_class
) -> list[list[int]]:
    """All prompts prefilled in one step, then decoded together until EOS or the limit."""
    driver = driver_class(model, num_blocks=256, block_size=16)
    chunks = {str(i): ids for i, ids in enumerate(prompts)}
    outputs: dict[str, list[int]] = {rid: [] for rid in chunks}
    while chunks:
        logits = driver.step(chunks)
        chunks = {}
        for rid, rows in logits.items():
            token = int(rows[-1].argmax())
            outputs[rid].append(token)
            if token not in eos_ids and len(outputs[rid]) < max_new:
                chunks[rid] = [token]
    return [outputs[str(i)] for i in range(len(prompts))]


def first_divergence_gap(model, prompt_ids, got, want) -> tuple[int, float] | None:
    """(index, transformers' logit of its token minus ours there) at the first token where
    `got` and `want` part, or None when they do not part."""
    index = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    if index is None:
        return None
    with torch.no_grad():
        logits = model(torch.tensor([[*prompt_ids, *want[:index]]])).logits[0, -1].float()
    return index, float(logits[want[index]] - logits[got[index]])
