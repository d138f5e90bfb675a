"""Tokenizer: text <-> token ids and chat prompts, run by the Rust `tokenizers` library itself.

Contract: for the model's tokenizer as transformers loads it (AutoTokenizer on the HF directory,
or on the GGUF with `gguf_file`), `encode` gives the same ids (special tokens added exactly when
transformers adds them by default: SmolLM2 adds none, Gemma a BOS), `decode` and
`convert_ids_to_tokens` the same strings, and `apply_chat_template` the ids of transformers'
`apply_chat_template(..., tokenize=True)` (the template rendered by models/chat_render.py).

transformers is not imported on the way here: a model's tokenizer is converted once, by
transformers, into the Rust tokenizer it configured plus the few facts transformers keeps
beside it (TokenizerFacts), and cached (models/tokenizer_cache.py). `hf`, transformers' own
object, is loaded on first use, for callers that compare against it.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

from engine.models.chat_render import render_chat
from engine.models.chat_templates import fallback_template
from engine.models.tokenizer_cache import TokenizerFacts, load_tokenizer, transformers_tokenizer


class Tokenizer:
    def __init__(self, backend: Any, facts: TokenizerFacts, source: Path | None = None) -> None:
        """backend: a tokenizers.Tokenizer without padding or truncation; source: the model
        file or directory it came from (for `hf`)."""
        self.backend = backend
        self.facts = facts
        self.source = source
        backend.encode_special_tokens = facts.split_special_tokens
        self.chat_template = facts.chat_template or fallback_template(facts.architecture)
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)  # added tokens included
        # Bound once: the detokenizer decodes twice per generated token.
        self._decode = backend.decode

    @classmethod
    def from_path(cls, path: str | Path) -> Tokenizer | None:
        """Tokenizer of an HF directory or GGUF file; None when it has no tokenizer."""
        from engine.models.loader import resolve_model_path

        source = resolve_model_path(path)
        loaded = load_tokenizer(source)
        return None if loaded is None else cls(*loaded, source)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        text = self._decode(ids, skip_special_tokens=skip_special_tokens)
        return _clean_up_spaces(text) if self.facts.clean_up_spaces else text

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        id_to_token = self.backend.id_to_token
        return [id_to_token(int(i)) for i in ids]

    def template_for(self, tools: bool = False) -> str | None:
        """The chat template transformers would pick (a model may name several: `tool_use`
        when there are tools, else `default`); None when the model has none to use."""
        templates = self.chat_template
        if not isinstance(templates, dict):
            return templates
        if tools and "tool_use" in templates:
            return templates["tool_use"]
        return templates.get("default")

    @property
    def supports_tools(self) -> bool:
        """Whether the chat template renders tool definitions (it reads `tools`)."""
        return "tools" in (self.template_for(tools=True) or "")

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """Token ids of `messages` (and `tools`) rendered by the model's chat template."""
        template = self.template_for(tools=tools is not None)
        if not template and isinstance(self.chat_template, dict):
            raise ValueError(
                f"this model's chat templates are {sorted(self.chat_template)}, and none is "
                "named 'default'"
            )
        if not template:
            raise ValueError(
                "this model's tokenizer has no chat template; use the completions endpoint "
                "(plain prompt) instead of chat"
            )
        text = render_chat(
            template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.facts.special_tokens,
        )
        return self.encode(text, add_special_tokens=False)

    @property
    def eos_token_id(self) -> int | None:
        return self.facts.eos_token_id

    @property
    def bos_token_id(self) -> int | None:
        return self.facts.bos_token_id

    @property
    def all_special_ids(self) -> list[int]:
        return list(self.facts.all_special_ids)

    @cached_property
    def hf(self) -> Any:
        """transformers' tokenizer of the same source, loaded now (seconds: for comparisons,
        never on the serving path)."""
        if self.source is None:
            raise ValueError("this tokenizer was not loaded from a model file or directory")
        hf = transformers_tokenizer(self.source)
        if not getattr(hf, "chat_template", None):
            hf.chat_template = self.chat_template
        return hf


def _clean_up_spaces(text: str) -> str:
    """transformers' `clean_up_tokenization` (spaces before punctuation and English
    contractions), which it applies to decoded text when a (non-BPE) tokenizer asks for it."""
    for before, after in _CLEAN_UPS:
        text = text.replace(before, after)
    return text


_CLEAN_UPS = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)
