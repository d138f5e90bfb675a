"""GrammarMatcher and the sampler's mask on the character tokenizer (one token per character,
EOS = 2): masks per draft row, draft cuts, state untouched by verification, bad grammars."""

from __future__ import annotations

import json

import pytest
import torch

from engine.models.tokenizer import Tokenizer
from engine.sample.sampler import Sampler, SamplingRow, apply_bitmask
from engine.sampling_params import GuidedDecoding, SamplingParams
from engine.structured.grammar import GrammarCompiler, check_guided
from engine.structured.matcher import GrammarMatcher
from tests.tiny_tokenizer import save_char_tokenizer

EOS = 2


@pytest.fixture(scope="module")
def compiler(tmp_path_factory) -> GrammarCompiler:
    path = save_char_tokenizer(tmp_path_factory.mktemp("char-tok"))
    return GrammarCompiler(Tokenizer.from_path(path), 256, [EOS])


def ids(compiler: GrammarCompiler, text: str) -> list[int]:
    return compiler.tokenizer.encode(text, add_special_tokens=False)


def allowed(bitmask_row) -> set[int]:
    logits = torch.zeros(1, 256)
    apply_bitmask(logits, torch.from_numpy(bitmask_row[None]))
    return set(torch.nonzero(logits[0] == 0).flatten().tolist())


def test_masks_follow_the_draft_and_leave_the_state_alone(compiler):
    matcher = compiler.matcher(GuidedDecoding("choice", json.dumps(["cat", "car", "dog"])))
    c, a, t, r, d = (ids(compiler, ch)[0] for ch in "catrd")
    assert matcher.valid_prefix([c, a, t, EOS, c]) == 4
    assert matcher.valid_prefix([c, d]) == 1
    masks = matcher.masks([c, a, t])
    assert [allowed(row) for row in masks] == [{c, d}, {a}, {t, r}, {EOS}]
    assert allowed(matcher.masks([])[0]) == {c, d}  # unchanged by the masks above
    assert matcher.accept(c) and matcher.accept(a)
    assert allowed(matcher.masks([])[0]) == {t, r}
    assert not matcher.accept(d)


def test_json_schema_and_regex_masks(compiler):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    matcher = compiler.matcher(GuidedDecoding("json", json.dumps(schema)))
    text = ids(compiler, '{"ok": true}')
    assert matcher.valid_prefix(text + [EOS]) == len(text) + 1
    assert matcher.valid_prefix(ids(compiler, '{"ok": 5}')) == len('{"ok": ')
    regex = compiler.matcher(GuidedDecoding("regex", r"\d{2}"))
    (row,) = regex.masks([])
    assert allowed(row) == set(ids(compiler, "0123456789"))


@pytest.mark.parametrize(
    "guided",
    [
        GuidedDecoding("json", "[1, 2]"),
        GuidedDecoding("json", "{not json"),
        GuidedDecoding("regex", "[a-"),
        GuidedDecoding("grammar", "start: ("),
    ],
)
def test_malformed_grammars_are_value_errors_naming_guided(compiler, guided):
    with pytest.raises(ValueError, match="^guided: invalid"):
        check_guided(guided)
    with pytest.raises(ValueError, match="^guided: invalid"):
        compiler.matcher(guided)


def test_sampler_masks_only_the_grammar_rows():
    logits = torch.randn(3, 64)
    bitmask = torch.full((3, 2), -1, dtype=torch.int32)
    bitmask[1] = 0
    bitmask[1, 1] = 1 << 3  # row 1 allows token 35 only
    rows = [SamplingRow(SamplingParams(temperature=0))] * 2 + [SamplingRow(SamplingParams())]
    probs = Sampler().process(logits, rows, bitmask)
    plain = Sampler().process(logits, rows)
    assert probs[1].argmax() == 35 and probs[1, 35] == 1
    assert torch.equal(probs[0], plain[0]) and torch.allclose(probs[2], plain[2])


def test_guided_params_refuse_ignore_eos_and_min_tokens():
    guided = GuidedDecoding("regex", "a+")
    for extra in ({"ignore_eos": True}, {"min_tokens": 2}):
        with pytest.raises(ValueError, match="^guided"):
            SamplingParams(guided=guided, **extra)


class _Panic(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException, not an Exception."""


class _PanickingLibrary:
    def __getattr__(self, name):
        def panic(*args, **kwargs):
            raise _Panic(name)

        return panic


def test_a_library_panic_never_escapes_as_a_base_exception():
    matcher = GrammarMatcher(_PanickingLibrary(), 64)
    assert matcher.accept(5) is False  # the request fails alone (append_until_stop)
    assert matcher.valid_prefix([1, 2]) == 0  # no draft for it this step
    with pytest.raises(RuntimeError, match="grammar mask failed"):  # step isolation's kind
        matcher.masks([])


def test_a_grammar_request_whose_library_fails_fails_alone(tmp_path, monkeypatch):
    from engine.config import EngineConfig
    from engine.front.llm import LLM
    from tests.conftest import build_tiny_llama

    path = save_char_tokenizer(build_tiny_llama(tmp_path))
    llm = LLM(config=EngineConfig.from_flat(dict(model=str(path), num_kv_blocks=32, threads=1)))
    monkeypatch.setattr(GrammarMatcher, "accept", lambda self, token_id: False)
    bad = SamplingParams(max_tokens=8, temperature=0, guided=GuidedDecoding("regex", "[a-z]+"))
    good = SamplingParams(max_tokens=8, temperature=0)
    failed, fine = llm.generate(["hello", "hello"], [bad, good], use_tqdm=False)
    assert failed.finish_reason == "error" and "grammar" in failed.error
    assert fine.finish_reason == "length" and len(fine.output_token_ids) == 8
    stats = llm.engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks


@pytest.mark.parametrize("spec", ['\x91"\x0b', "\x91", "\x91+"])
def test_a_grammar_no_token_can_begin_is_refused_when_compiled(compiler, spec):
    # \x91 and \x92 are no token of the character tokenizer: llguidance would offer one token
    # it then refuses, and the request failed at its first output token (a 500, found by
    # benchmarks/fuzz_api.py)
    with pytest.raises(ValueError, match="^guided: the regex cannot begin with any token"):
        compiler.matcher(GuidedDecoding("regex", spec))


@pytest.mark.parametrize(
    "kind, spec",
    [("regex", "ab\x91"), ("regex", ""), ("choice", json.dumps(["\x91", "ok"])), ("regex", "a?")],
)
def test_a_grammar_some_token_can_begin_compiles(compiler, kind, spec):
    matcher = compiler.matcher(GuidedDecoding(kind, spec))
    assert matcher.can_start()
    assert allowed(matcher.masks([])[0])  # the sampler gets a token it may pick


def test_stuck_after_tells_a_dead_end_from_a_refused_token(compiler):
    a, b, c, z = (ids(compiler, ch)[0] for ch in "abcz")
    dead = compiler.matcher(GuidedDecoding("choice", json.dumps(["ab\x91", "ab\x91x"])))
    assert dead.accept(a) and dead.accept(b)
    assert allowed(dead.masks([])[0]) and not dead.can_start()  # one token, refused
    assert not dead.accept(next(iter(allowed(dead.masks([])[0]))))
    assert dead.stuck_after([a, b]) and not dead.stuck_after([a])
    alive = compiler.matcher(GuidedDecoding("choice", json.dumps(["abc"])))
    assert alive.accept(a) and alive.accept(b) and not alive.accept(z)
    assert not alive.stuck_after([a, b])  # "c" could follow: the refusal was a fault
    assert not alive.stuck_after([z])  # tokens that do not replay: not a dead end either
