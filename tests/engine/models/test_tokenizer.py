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


def test_gguf_tokenizer_pickle_restores_the_same_tokenizer(smollm2_path, tmp_path, monkeypatch):
    from engine.models import tokenizer as module

    monkeypatch.setenv("GOODSPEED_CACHE_DIR", str(tmp_path))
    built = Tokenizer.from_path(smollm2_path)  # from the GGUF: the directory and the pickle
    cache = module._cache_dir(smollm2_path)
    assert module._pickle_path(cache).is_file()
    assert not list(cache.glob("*.tmp"))
    loaded = Tokenizer.from_path(smollm2_path)  # from the pickle
    assert type(loaded.hf) is type(built.hf)
    assert loaded.hf.chat_template == built.hf.chat_template
    assert (loaded.eos_token_id, loaded.bos_token_id) == (built.eos_token_id, built.bos_token_id)
    assert loaded.vocab_size == built.vocab_size
    assert loaded.all_special_ids == built.all_special_ids
    assert loaded._decode == loaded.hf._tokenizer.decode  # still the Rust decode
    text = "Hello <|im_start|>world, the café costs 3€!\n\tdef f(x): return x ** 2"
    assert loaded.encode(text) == built.encode(text)
    messages = [{"role": "user", "content": text}]
    assert loaded.apply_chat_template(messages) == built.apply_chat_template(messages)
    assert_decodes_like_hf(loaded, 200)
    for ids in random_ids(built.vocab_size, 200, seed=1):
        assert loaded.decode(ids) == built.decode(ids)


def test_a_bad_or_outdated_tokenizer_pickle_is_replaced(smollm2_path, tmp_path, monkeypatch):
    from engine.models import tokenizer as module

    monkeypatch.setenv("GOODSPEED_CACHE_DIR", str(tmp_path))
    reference = Tokenizer.from_path(smollm2_path)
    cache = module._cache_dir(smollm2_path)
    pickled = module._pickle_path(cache)
    pickled.write_bytes(b"not a pickle")
    assert Tokenizer.from_path(smollm2_path).encode("a b c") == reference.encode("a b c")
    assert module._unpickled(cache) is not None  # rewritten from the directory
    import tokenizers

    monkeypatch.setattr(tokenizers, "__version__", "0.0.0-other")
    assert module._pickle_path(cache) != pickled  # another tokenizers: another pickle
    assert module._unpickled(cache) is None
