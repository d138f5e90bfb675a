"""Compile a request's GuidedDecoding into llguidance grammars and matchers.

llguidance was chosen over xgrammar by measured mask cost on SmolLM2's vocabulary (49,152
tokens, CPU; benchmarks/grammar_mask_cost.py, docs/api.md): 0.13 ms vs 0.17 ms per decode
step, 1.6 ms vs 7.2 ms to compile a schema, and no triton / TVM dependency.

The llguidance tokenizer is built once per engine, on the first guided request (0.46 s for
SmolLM2's 49k vocabulary here, on the engine thread; later requests compile in ~1 ms). Byte-level
BPE tokenizers go to llguidance as their tokenizer.json; others (the test character tokenizer)
as each token's decoded bytes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.sampling_params import GuidedDecoding
from engine.structured.matcher import GrammarMatcher

# JSON without free whitespace: small models otherwise wander into endless blank runs; a schema
# may override this with its own "x-guidance" options (llguidance's JSON compile options).
_JSON_DEFAULTS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def grammar_text(guided: GuidedDecoding) -> str:
    """llguidance's grammar for the constraint; ValueError naming `guided` when malformed."""
    import llguidance

    try:
        if guided.kind == "json":
            schema = json.loads(guided.spec)
            if not isinstance(schema, dict):
                raise ValueError("a JSON schema must be a JSON object")
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_DEFAULTS)
        if guided.kind == "choice":
            choices = json.loads(guided.spec)
            if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
                raise ValueError("a choice must be a JSON list of strings")
            lark = "start: " + " | ".join(json.dumps(c) for c in choices)
            return llguidance.LLMatcher.grammar_from_lark(lark)
        if guided.kind == "regex":
            return llguidance.LLMatcher.grammar_from_regex(guided.spec)
        return llguidance.grammar_from("grammar", guided.spec)  # Lark or GBNF
    except ValueError as exc:
        raise ValueError(f"guided: invalid {guided.kind}: {exc}") from None
    except BaseException as exc:  # llguidance's Rust panics are BaseExceptions
        raise as_value_error(exc, guided) from None


def as_value_error(exc: BaseException, guided: GuidedDecoding) -> BaseException:
    """A failure of the grammar library as the request's ValueError (a 400): a Rust panic
    (pyo3's PanicException derives from BaseException) must never reach the engine thread's
    loop. Interpreter exits pass through."""
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        return exc
    return ValueError(f"guided: the {guided.kind} could not be compiled: {type(exc).__name__}")


def check_guided(guided: GuidedDecoding) -> None:
    """Validate without a tokenizer (for API layers, before admission)."""
    import llguidance

    grammar = grammar_text(guided)
    try:
        error = llguidance.LLMatcher.validate_grammar(grammar)
    except BaseException as exc:
        raise as_value_error(exc, guided) from None
    if error and not error.startswith("WARNING"):
        raise ValueError(f"guided: invalid {guided.kind}: {error}")


class GrammarCompiler:
    """Per engine: the llguidance tokenizer, and a fresh matcher per request."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self.tokenizer = tokenizer  # engine.models.tokenizer.Tokenizer (or a test stand-in)
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self._ll_tokenizer = None

    def matcher(self, guided: GuidedDecoding) -> GrammarMatcher:
        import llguidance

        if self.tokenizer is None:
            raise ValueError("guided: this model has no tokenizer, so no grammar can apply")
        grammar = grammar_text(guided)
        try:
            matcher = llguidance.LLMatcher(self._llguidance_tokenizer(), grammar, log_level=0)
        except BaseException as exc:
            raise as_value_error(exc, guided) from None
        if matcher.is_error():
            raise ValueError(f"guided: invalid {guided.kind}: {matcher.get_error()}")
        wrapped = GrammarMatcher(matcher, self.vocab_size)
        if not wrapped.can_start():
            raise ValueError(
                f"guided: the {guided.kind} cannot begin with any token of this model's "
                "vocabulary (it needs text the tokenizer cannot spell)"
            )
        return wrapped

    def _llguidance_tokenizer(self):
        if self._ll_tokenizer is None:
            self._ll_tokenizer = _build_ll_tokenizer(
                self.tokenizer, self.vocab_size, self.eos_token_ids
            )
        return self._ll_tokenizer


def _build_ll_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: list[int]):
    """tokenizer: engine.models.tokenizer.Tokenizer (its Rust tokenizer as JSON, as
    llguidance.hf would hand it over, without importing transformers)."""
    import llguidance

    eos = eos_token_ids or [tokenizer.eos_token_id]
    try:
        return llguidance.LLTokenizer(tokenizer.backend.to_str(), n_vocab=vocab_size, eos_token=eos)
    except ValueError:  # not a byte-level tokenizer llguidance knows: give it the bytes
        wrapper = llguidance.TokenizerWrapper(_TokenBytes(tokenizer, vocab_size, eos[0]))
        return llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)


class _TokenBytes:
    """What llguidance.TokenizerWrapper reads: each token's bytes (special tokens as
    b"\\xff" + name, llguidance's convention), EOS/BOS ids, and an encoder."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_id: int) -> None:
        special = set(tokenizer.all_special_ids)
        self.tokens = [
            (b"\xff" + tokenizer.convert_ids_to_tokens([i])[0].encode())
            if i in special
            else tokenizer.decode([i], skip_special_tokens=False).encode()
            for i in range(min(vocab_size, tokenizer.vocab_size))
        ]
        self.special_token_ids = sorted(special)
        self.eos_token_id = eos_token_id
        self.bos_token_id = tokenizer.bos_token_id
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False)
