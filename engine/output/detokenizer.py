"""Incremental detokenization with stop strings.

Text is produced a few tokens at a time. Byte-level BPE tokens can split a UTF-8 character, so a
delta is only released once it no longer ends in U+FFFD (the replacement character of a broken
sequence). Two offsets make each step cost O(new tokens): `prefix_offset` marks tokens decoded
only for context (so leading-space rules of the tokenizer apply), `read_offset` the first token
whose text has not been released yet.

Stop strings: the released text never contains the start of a possible stop string; the longest
suffix of the text that is a prefix of some stop string is held back until it is resolved.
This lives in the engine (not the server, as DESIGN §2 first placed it) because the offline API
needs stop strings to end generation too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


_BROKEN = "\ufffd"
_CONTEXT_TOKENS = 5


@dataclass
class IncrementalDetokenizer:
    tokenizer: _Decoder
    prompt_token_ids: list[int]
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True

    token_ids: list[int] = field(default_factory=list)
    text: str = ""  # all decoded output text (truncated at a stop string once one matched)
    stop_string: str | None = None
    _prefix_offset: int = 0
    _read_offset: int = 0
    _num_released: int = 0  # characters of `text` handed out so far

    def __post_init__(self) -> None:
        # Start with a little prompt context so the first output token decodes as it would mid-text.
        self.token_ids = list(self.prompt_token_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self.token_ids)

    def add_tokens(self, new_token_ids: list[int], finished: bool = False) -> str:
        """Append tokens; return the newly releasable text (may be empty). `finished`: the
        request ends with these tokens, so no stop string can match any more and nothing is
        held back."""
        if self.stop_string is not None:
            return ""
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            self._decode_step()
            if self._check_stop():
                break
        return self._release(finished)

    def _decode_step(self) -> None:
        decode = self.tokenizer.decode
        ids = self.token_ids
        prefix = decode(
            ids[self._prefix_offset : self._read_offset],
            skip_special_tokens=self.skip_special_tokens,
        )
        full = decode(ids[self._prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        if len(full) > len(prefix) and not full.endswith(_BROKEN):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)

    def _check_stop(self) -> bool:
        if not self.stop:
            return False
        # Only text not yet released can contain the start of a new match.
        window_start = max(0, self._num_released - max(len(s) for s in self.stop))
        best: tuple[int, str] | None = None
        for stop in self.stop:
            index = self.text.find(stop, window_start)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is None:
            return False
        index, stop = best
        self.text = (
            self.text[: index + len(stop)] if self.include_stop_str_in_output else self.text[:index]
        )
        self.stop_string = stop
        return True

    def _holdback(self) -> int:
        """Length of the longest suffix of text that could still grow into a stop string."""
        if self.stop_string is not None or not self.stop:
            return 0
        longest = 0
        for stop in self.stop:
            for length in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def _release(self, finished: bool) -> str:
        end = len(self.text) - (0 if finished else self._holdback())
        end = max(end, self._num_released)
        delta = self.text[self._num_released : end]
        self._num_released = end
        return delta
