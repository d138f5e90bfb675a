"""Tokenizer.decode calls the Rust tokenizer directly when that gives hf.decode's exact text."""

from __future__ import annotations

import random

import pytest

from engine.models.tokenizer import Tokenizer
from tests.tiny_tokenizer import save_char_tokenizer


def random_ids(vocab_size: int, count: int, seed: int = 0) -> list[list[int]]:
    """Id lists of 0..16 tokens, special ids (the lowest) over-represented."""
    rng = random.Random(seed)
    return [
        [rng.randrange(vocab_size) if rng.random() < 0.7 else rng.randrange(8) for _ in range(n)]
        for n in (rng.randrange(17) for _ in range(count))
    ]


def assert_decodes_like_hf(tokenizer: Tokenizer, count: int) -> None:
    for ids in random_ids(tokenizer.vocab_size, count):
        for skip in (True, False):
            assert tokenizer.decode(ids, skip) == tokenizer.hf.decode(ids, skip_special_tokens=skip)


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_path(save_char_tokenizer(tmp_path_factory.mktemp("char-tokenizer")))


def test_stock_fast_tokenizer_decodes_in_rust_with_the_same_text(char_tokenizer):
    assert char_tokenizer._decode == char_tokenizer.hf._tokenizer.decode
    assert_decodes_like_hf(char_tokenizer, 500)


def test_clean_up_of_spaces_keeps_transformers_decode(tmp_path):
    path = save_char_tokenizer(tmp_path)
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(path, clean_up_tokenization_spaces=True)
    tokenizer = Tokenizer(hf)
    assert tokenizer._decode == hf.decode
    ids = tokenizer.encode("a , b .")
    assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_smollm2_decodes_like_transformers(smollm2_path):
    tokenizer = Tokenizer.from_path(smollm2_path)
    assert tokenizer._decode == tokenizer.hf._tokenizer.decode
    assert_decodes_like_hf(tokenizer, 2000)
