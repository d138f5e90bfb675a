"""LLMEngine.from_config loads the tokenizer on a second thread while the model loads: the
engine gets the same tokenizer as a load on its own, and a failure on that thread surfaces."""

from __future__ import annotations

import threading

import pytest

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine, _in_background
from engine.models.tokenizer import Tokenizer


def test_in_background_returns_the_result_from_another_thread():
    future = _in_background(lambda a, b: (a + b, threading.current_thread().name), 2, 3)
    total, thread = future.result(timeout=10)
    assert total == 5 and thread != threading.current_thread().name


def test_in_background_hands_the_exception_over():
    def fail() -> None:
        raise OSError("no such tokenizer")

    with pytest.raises(OSError, match="no such tokenizer"):
        _in_background(fail).result(timeout=10)


def test_engine_gets_the_tokenizer_a_plain_load_gives(smollm2_path):
    config = EngineConfig.from_flat({"model": str(smollm2_path), "num_kv_blocks": 16})
    engine = LLMEngine.from_config(config)
    alone = Tokenizer.from_path(smollm2_path)
    text = "The capital of France is Paris."
    assert engine.tokenizer.encode(text) == alone.encode(text)
    messages = [{"role": "user", "content": text}]
    assert engine.tokenizer.apply_chat_template(messages) == alone.apply_chat_template(messages)
    assert engine.eos_token_ids
