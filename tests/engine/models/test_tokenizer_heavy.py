"""The tokenizer contract (tokenizer_contract.py) on the real-model benchmark's files: the Qwen2.5
Coder 1.5B (152k tokens, a template with tools) and Gemma 3 270M (262k tokens, a BOS added, no
template in the file: both sides get Gemma's turn format), each loaded from its cache entry."""

from __future__ import annotations

import pytest

from engine.models.tokenizer import Tokenizer
from tests.engine.models import hf_gguf
from tests.engine.models.tokenizer_contract import (
    TEXTS,
    assert_chats_like,
    assert_decodes_like,
    assert_encodes_like,
    assert_facts_like,
)

pytestmark = [pytest.mark.heavy, pytest.mark.slow]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city, «quoted»",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]
CODE = 'fn main() {\n    let v: Vec<u8> = (0..10).collect();\n    println!("{:?}", v);\n}\n'


def cached_and_reference(path, cache_dir, monkeypatch) -> tuple[Tokenizer, object]:
    monkeypatch.setenv("GOODSPEED_CACHE_DIR", str(cache_dir))
    Tokenizer.from_path(path)  # converts and writes the entry
    return Tokenizer.from_path(path), hf_gguf.hf_tokenizer(path)


def test_qwen_1_5b_is_transformers(qwen_pair, tmp_path, monkeypatch):
    tokenizer, hf = cached_and_reference(qwen_pair[0], tmp_path, monkeypatch)
    assert_facts_like(tokenizer, hf)
    assert_encodes_like(tokenizer, hf, [*TEXTS, CODE])
    assert_decodes_like(tokenizer, hf, 2000)
    assert tokenizer.supports_tools
    assert_chats_like(tokenizer, hf)
    assert_chats_like(tokenizer, hf, tools=TOOLS)


def test_gemma3_270m_is_transformers(gemma3_270m, tmp_path, monkeypatch):
    tokenizer, hf = cached_and_reference(gemma3_270m, tmp_path, monkeypatch)
    assert tokenizer.encode("Hi")[0] == tokenizer.bos_token_id  # Gemma adds its BOS
    assert_facts_like(tokenizer, hf)
    assert_encodes_like(tokenizer, hf, [*TEXTS, CODE])
    assert_decodes_like(tokenizer, hf, 2000)
    assert hf.chat_template is None  # the file has none: transformers gets ours to compare
    hf.chat_template = tokenizer.chat_template
    assert_chats_like(tokenizer, hf)
