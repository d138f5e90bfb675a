"""Tokenizer: the Rust tokenizer and facts converted once by transformers behave like
transformers' tokenizer (tests/engine/models/tokenizer_contract.py), load from the cache without
importing transformers, and a bad or stale cache entry is converted again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models import tokenizer_cache
from engine.models.tokenizer import Tokenizer
from tests.engine.models import hf_gguf
from tests.engine.models.tokenizer_contract import (
    assert_chats_like,
    assert_decodes_like,
    assert_encodes_like,
    assert_facts_like,
)
from tests.tiny_tokenizer import save_char_tokenizer

ROOT = Path(__file__).resolve().parents[3]


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "tokenizers").iterdir() if not p.name.startswith("."))


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("GOODSPEED_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def smollm2(smollm2_path, tmp_path_factory):
    """(ours, loaded from its cache entry; transformers' tokenizer of the GGUF)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GOODSPEED_CACHE_DIR", str(tmp_path_factory.mktemp("smollm2-cache")))
        Tokenizer.from_path(smollm2_path)  # converts and writes the entry
        cached = Tokenizer.from_path(smollm2_path)
    return cached, hf_gguf.hf_tokenizer(smollm2_path)


def test_smollm2_encodes_and_decodes_like_transformers(smollm2):
    tokenizer, hf = smollm2
    assert_facts_like(tokenizer, hf)
    assert_encodes_like(tokenizer, hf)
    assert_decodes_like(tokenizer, hf, 1000)
    # SmolLM2 adds no BOS; its template writes <|im_start|> itself.
    assert tokenizer.encode("Hello") == tokenizer.encode("Hello", add_special_tokens=False)


def test_smollm2_chat_prompts_are_transformers(smollm2):
    tokenizer, hf = smollm2
    assert not tokenizer.supports_tools  # its template never reads `tools`
    assert_chats_like(tokenizer, hf)


def test_the_cached_tokenizer_loads_without_transformers(smollm2_path, smollm2, cache):
    """The whole cached path (load, encode, decode, chat) in a fresh interpreter."""
    Tokenizer.from_path(smollm2_path)  # fills `cache`
    tokenizer, _ = smollm2
    messages = [{"role": "user", "content": "Hi"}]
    script = (
        "import sys, json\n"
        "from engine.models.tokenizer import Tokenizer\n"
        f"t = Tokenizer.from_path({str(smollm2_path)!r})\n"
        f"chat = t.apply_chat_template({messages!r})\n"
        "print(json.dumps([chat, t.decode(chat, False), 'transformers' in sys.modules]))\n"
    )
    env = {"GOODSPEED_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    chat, text, imported = json.loads(out.stdout.splitlines()[-1])
    assert chat == tokenizer.apply_chat_template(messages)
    assert text == tokenizer.decode(chat, False)
    assert not imported


@pytest.fixture
def char_dir(tmp_path) -> Path:
    return save_char_tokenizer(tmp_path / "char")


@pytest.mark.parametrize("damage", ["facts", "tokenizer", "key", "missing-file"])
def test_a_bad_cache_entry_is_converted_again(char_dir, cache, damage):
    reference = Tokenizer.from_path(char_dir)
    [entry] = entries(cache)
    if damage == "facts":
        (entry / "facts.json").write_text("{not json")
    elif damage == "tokenizer":
        (entry / "tokenizer.json").write_text('{"version": "1.0", "model": 7}')
    elif damage == "key":
        record = json.loads((entry / "facts.json").read_text())
        (entry / "facts.json").write_text(json.dumps({**record, "key": "another source"}))
    else:
        (entry / "tokenizer.json").unlink()
    tokenizer = Tokenizer.from_path(char_dir)
    assert tokenizer.encode("a b c") == reference.encode("a b c")
    assert entries(cache) == [entry]
    assert not [p for p in (cache / "tokenizers").iterdir() if p.name.startswith(".")]
    assert tokenizer_cache._read_entry(entry, tokenizer_cache._source_key(char_dir))


def test_a_changed_source_gets_a_new_entry_and_the_stale_one_goes(char_dir, cache, tmp_path):
    Tokenizer.from_path(char_dir)
    [old] = entries(cache)
    other = save_char_tokenizer(tmp_path / "other")
    Tokenizer.from_path(other)
    assert len(entries(cache)) == 2
    config = char_dir / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "model_max_length": 77}))
    Tokenizer.from_path(char_dir)  # another key: converted again
    assert old not in entries(cache) and len(entries(cache)) == 2


def test_the_char_tokenizer_matches_transformers(char_dir, cache):
    from transformers import AutoTokenizer

    tokenizer, hf = Tokenizer.from_path(char_dir), AutoTokenizer.from_pretrained(char_dir)
    assert_facts_like(tokenizer, hf)
    assert_encodes_like(tokenizer, hf, ["", "a b", "héllo, world!", "<s>x</s>"])
    assert_decodes_like(tokenizer, hf, 300)
    assert_chats_like(tokenizer, hf)


def test_clean_up_of_spaces_is_transformers(tmp_path, cache):
    """A (non-BPE) tokenizer that asks for transformers' clean-up of decoded text gets it."""
    from transformers import AutoTokenizer

    path = save_char_tokenizer(tmp_path / "char")
    config = path / "tokenizer_config.json"
    config.write_text(
        json.dumps({**json.loads(config.read_text()), "clean_up_tokenization_spaces": True})
    )
    tokenizer, hf = Tokenizer.from_path(path), AutoTokenizer.from_pretrained(path)
    assert tokenizer.facts.clean_up_spaces
    ids = tokenizer.encode("a , b . I 'm here ?")
    assert tokenizer.decode(ids) == hf.decode(ids, skip_special_tokens=True) == "a, b. I'm here?"


def test_a_tokenizer_class_with_python_text_code_is_refused(char_dir):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(char_dir)

    class Custom(type(hf)):
        def _decode(self, *args, **kwargs):
            return "?"

    hf.__class__ = Custom
    with pytest.raises(ValueError, match="Custom overrides _decode"):
        tokenizer_cache.convert(hf)


def test_named_chat_templates_are_picked_like_transformers(char_dir, cache):
    from dataclasses import replace

    from transformers import AutoTokenizer

    loaded, hf = Tokenizer.from_path(char_dir), AutoTokenizer.from_pretrained(char_dir)
    templates = {
        "default": "{% for m in messages %}{{ m.content }};{% endfor %}",
        "tool_use": "{{ tools | length }} tools:{% for m in messages %}{{ m.content }}{% endfor %}",
    }
    tokenizer = Tokenizer(loaded.backend, replace(loaded.facts, chat_template=templates))
    hf.chat_template = templates
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tokenizer.supports_tools
    assert_chats_like(tokenizer, hf)
    assert_chats_like(tokenizer, hf, tools=tools)
    unnamed = Tokenizer(loaded.backend, replace(loaded.facts, chat_template={"x": "x"}))
    assert not unnamed.supports_tools
    with pytest.raises(ValueError, match=r"templates are \['x'\], and none is named 'default'"):
        unnamed.apply_chat_template([{"role": "user", "content": "hi"}])


def test_merges_are_cached_as_strings_only_where_that_reads_back_the_same():
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models

    def bpe(vocab: dict[str, int], merges: list[tuple[str, str]]) -> RustTokenizer:
        return RustTokenizer(models.BPE(vocab, merges))

    plain = bpe({"a": 0, "b": 1, "ab": 2, "abb": 3}, [("a", "b"), ("ab", "b")])
    text = tokenizer_cache._backend_json(plain)
    assert json.loads(text)["model"]["merges"] == ["a b", "ab b"]
    assert RustTokenizer.from_str(text).to_str() == plain.to_str()
    spaced = bpe({"a": 0, " ": 1, "a ": 2, "b": 3, "a b": 4}, [("a", " "), ("a ", "b")])
    assert tokenizer_cache._backend_json(spaced) == spaced.to_str()  # pairs kept


def test_entries_of_other_library_versions_stay(char_dir, cache, monkeypatch):
    Tokenizer.from_path(char_dir)
    [first] = entries(cache)
    monkeypatch.setattr(tokenizer_cache, "_version", lambda package: "9.9.9")
    Tokenizer.from_path(char_dir)  # another key: converted, beside the first
    assert first in entries(cache) and len(entries(cache)) == 2
