"""The tokenizer contract, checked against transformers' tokenizer of the same model: the same
ids from encode (with and without special tokens), the same strings from decode (skipping
special tokens or not) and convert_ids_to_tokens, the same facts, and the same chat prompts.
Shared by the SmolLM2 test and the heavy Qwen and Gemma tests."""

from __future__ import annotations

import random
from typing import Any

from engine.models.tokenizer import Tokenizer

TEXTS = [
    "",
    " ",
    "Hello world",
    "  leading and trailing spaces  ",
    "whitespace runs:           then\t\t\ttabs\n\n\n\nand\r\nCRLF\r\n",
    "\n",
    "def f(x):\n    return x ** 2  # square\n\nclass A:\n\tpass\n",
    'json = {"a": [1, 2.5, -3e-7], "b": null, "c": "\\u00e9"}',
    "unicode: café naïve Ærøskøbing 日本語のテキスト 한국어 Ελληνικά ∑∫√ 🙂👍🏽👨‍👩‍👧",
    "combining e\u0301 and zero\u200bwidth and rtl \u05e9\u05dc\u05d5\u05dd",
    "control \x00 \x07 \x1b[31m chars",
    "numbers 0 12 345 6789 3.14159 0xFF 1_000_000",
    "a" * 300,
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "<|im_start|><|im_start|> <|im_end|>",
    "broken <|im_start and <|im_end",
    "<bos><start_of_turn>user\nhi<end_of_turn>\n<eos><pad><unk>",
    "<s></s><unk>[INST] hi [/INST]",
]


def conversations(special: str) -> list[list[dict[str, Any]]]:
    """Chats of every shape a server sends; `special` is a special token's text, put into a
    message to see that it is rendered and encoded the same way."""
    return [
        [{"role": "user", "content": "Hi!"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why?"}],
        [
            {"role": "system", "content": "You are a coder."},
            {"role": "user", "content": "Write f."},
            {"role": "assistant", "content": "def f():\n    pass"},
            {"role": "user", "content": "Now in C, café 🙂."},
        ],
        [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "two", "tool_calls": None},
            {"role": "user", "content": f"three {special} four"},
        ],
        [{"role": "user", "content": "  spaced  \n\n"}, {"role": "assistant", "content": ""}],
    ]


def random_ids(vocab_size: int, count: int, seed: int = 0) -> list[list[int]]:
    """Id lists of 0..16 tokens, the lowest ids (the special ones, often) over-represented."""
    rng = random.Random(seed)
    return [
        [rng.randrange(vocab_size) if rng.random() < 0.7 else rng.randrange(8) for _ in range(n)]
        for n in (rng.randrange(17) for _ in range(count))
    ]


def assert_encodes_like(tokenizer: Tokenizer, hf: Any, texts: list[str] = TEXTS) -> None:
    for text in texts:
        for special in (True, False):
            want = list(hf.encode(text, add_special_tokens=special))
            assert tokenizer.encode(text, special) == want, (text, special)
        ids = tokenizer.encode(text)
        for skip in (True, False):
            assert tokenizer.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), text


def assert_decodes_like(tokenizer: Tokenizer, hf: Any, count: int) -> None:
    for ids in random_ids(tokenizer.vocab_size, count):
        for skip in (True, False):
            assert tokenizer.decode(ids, skip) == hf.decode(ids, skip_special_tokens=skip), ids
        assert tokenizer.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)


def assert_facts_like(tokenizer: Tokenizer, hf: Any) -> None:
    assert tokenizer.vocab_size == len(hf)
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (hf.bos_token_id, hf.eos_token_id)
    assert tokenizer.all_special_ids == list(hf.all_special_ids)


def assert_chats_like(tokenizer: Tokenizer, hf: Any, tools: list[dict] | None = None) -> None:
    special = hf.eos_token or ""
    for messages in conversations(special):
        for generation in (True, False):
            want = hf.apply_chat_template(
                messages, tools=tools, add_generation_prompt=generation, return_dict=True
            )["input_ids"]
            got = tokenizer.apply_chat_template(messages, generation, tools)
            assert got == list(want), (messages, generation)
