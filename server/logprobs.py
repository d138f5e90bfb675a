"""Engine TokenLogprobs -> the completions (`tokens`/`token_logprobs`/...) and chat logprobs shapes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from engine.outputs import TokenLogprobs
from server.responses import ChatLogprob, ChatTokenLogprob, CompletionLogprobs

# JSON has no -inf: tokens masked out by top-k/top-p/logit_bias report this floor instead.
LOGPROB_FLOOR = -9999.0
_CACHE_LIMIT = 1 << 16


def _finite(logprob: float) -> float:
    return LOGPROB_FLOOR if math.isnan(logprob) else max(logprob, LOGPROB_FLOOR)


class TokenTexts:
    """The text of single tokens for logprobs, cached (a token's text never changes)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            if self._tokenizer is None:
                text = f"<{token_id}>"
            else:
                text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._cache) < _CACHE_LIMIT:
                self._cache[token_id] = text
        return text


def completion_logprobs(
    positions: Sequence[tuple[int, TokenLogprobs | None]], texts: TokenTexts, offset: int
) -> tuple[CompletionLogprobs, int]:
    """Logprobs of (token_id, logprobs-or-None) positions whose text starts at `offset`.

    None marks a position without logprobs (the first prompt token). Returns the object and
    the offset just past these tokens, so streamed chunks continue where the last one ended.
    """
    result = CompletionLogprobs()
    for token_id, entry in positions:
        text = texts(token_id)
        result.tokens.append(text)
        result.text_offset.append(offset)
        offset += len(text)
        if entry is None:
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.token_logprobs.append(_finite(entry.logprob))
        result.top_logprobs.append({texts(t): _finite(lp) for t, lp in entry.top})
    return result, offset


def generated_positions(entries: Sequence[TokenLogprobs]) -> list[tuple[int, TokenLogprobs]]:
    return [(entry.token_id, entry) for entry in entries]


def prompt_positions(
    prompt_token_ids: Sequence[int], entries: Sequence[TokenLogprobs | None]
) -> list[tuple[int, TokenLogprobs | None]]:
    """Every prompt token, with None where the engine gave no logprobs (always the first)."""
    return [(t, entries[i] if i < len(entries) else None) for i, t in enumerate(prompt_token_ids)]


def chat_logprobs(entries: Sequence[TokenLogprobs], texts: TokenTexts) -> list[ChatTokenLogprob]:
    result = []
    for entry in entries:
        text = texts(entry.token_id)
        top = [_chat_logprob(texts(t), lp) for t, lp in entry.top]
        result.append(
            ChatTokenLogprob(
                token=text,
                logprob=_finite(entry.logprob),
                bytes=list(text.encode("utf-8", "replace")),
                top_logprobs=top,
            )
        )
    return result


def _chat_logprob(text: str, logprob: float) -> ChatLogprob:
    return ChatLogprob(
        token=text, logprob=_finite(logprob), bytes=list(text.encode("utf-8", "replace"))
    )
