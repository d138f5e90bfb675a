"""GrammarMatcher: one request's grammar state, advanced only by verified tokens.

Speculation stays lossless under a grammar (docs/api.md):
  1. before verification the request's draft is cut at the first token the grammar rejects
     (valid_prefix), so every draft row is reachable;
  2. at verification the row after draft prefix d[:j] is masked with the grammar's mask after
     d[:j] (masks: advance through the draft, fill, then roll back), so every row's target
     token is what plain decoding would emit there;
  3. after verification the matcher consumes the emitted tokens (accept), nothing else.
Bitmasks are int32 rows, bit i of word w allowing token 32 * w + i (llguidance's layout).

No failure of the library may take the engine down (a Rust panic is a BaseException): accept()
reports it as a refused token (the request fails alone), valid_prefix() as no usable draft,
masks() as a RuntimeError inside the step (step isolation fails that request alone).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class GrammarMatcher:
    def __init__(self, matcher: Any, vocab_size: int) -> None:
        self._matcher = matcher  # llguidance.LLMatcher
        self._start = _copy(matcher)  # its start state (stuck_after); None if it failed
        self.vocab_size = vocab_size
        self.num_words = (vocab_size + 31) // 32

    def accept(self, token_id: int) -> bool:
        """Advance by one verified token; False when the grammar refuses it."""
        try:
            return bool(self._matcher.consume_token(token_id))
        except BaseException as exc:
            _reraise_exits(exc)
            return False

    def valid_prefix(self, draft_ids: Sequence[int]) -> int:
        """How many leading draft tokens the grammar accepts from the current state."""
        if not draft_ids:
            return 0
        try:
            return int(self._matcher.validate_tokens(list(draft_ids)))
        except BaseException as exc:
            _reraise_exits(exc)
            return 0

    def masks(self, draft_ids: Sequence[int]) -> np.ndarray:
        """int32 [1 + len(draft_ids), num_words]: the mask of each verification row (the
        drafts must be a valid prefix). The matcher's state is unchanged afterwards. A
        finished grammar (or one past an EOS draft) allows only EOS."""
        import llguidance.numpy as llnp

        bitmask = np.full((1 + len(draft_ids), self.num_words), -1, dtype=np.int32)
        consumed = 0
        try:
            for row in range(len(draft_ids) + 1):
                llnp.fill_next_token_bitmask(self._matcher, bitmask, row)
                if row < len(draft_ids):
                    if not self._matcher.consume_token(draft_ids[row]):
                        raise ValueError(f"draft token {draft_ids[row]} breaks the grammar")
                    consumed += 1
        except BaseException as exc:
            _reraise_exits(exc)
            raise RuntimeError(f"grammar mask failed: {type(exc).__name__}: {exc}") from None
        finally:
            if consumed:
                self._matcher.rollback(consumed)
        return bitmask

    def can_start(self) -> bool:
        """Whether some token of the vocabulary can come next (or end a finished grammar). A
        grammar that needs text the vocabulary cannot spell (a character no token has) gets
        stuck: llguidance then offers only a token it refuses to consume."""
        return _can_continue(self._matcher, self.num_words)

    def stuck_after(self, token_ids: Sequence[int]) -> bool:
        """Whether no token can follow `token_ids` (the tokens it accepted so far), asked after
        it refused one: on a copy of its start state, because a refused token leaves
        llguidance in an error state that stays (whose mask offers EOS). False where the
        tokens do not replay (not a dead end: a fault)."""
        try:
            matcher = self._start.deep_copy() if self._start is not None else None
            if matcher is None:
                return False
            if token_ids and not matcher.consume_tokens(list(token_ids)):
                return False
        except BaseException as exc:
            _reraise_exits(exc)
            return False
        return not _can_continue(matcher, self.num_words)


def _copy(matcher: Any) -> Any:
    try:
        return matcher.deep_copy()
    except BaseException as exc:
        _reraise_exits(exc)
        return None


def _can_continue(matcher: Any, num_words: int) -> bool:
    """Whether the first token the mask of `matcher`'s state allows is one it accepts."""
    import llguidance.numpy as llnp

    row = np.zeros((1, num_words), dtype=np.int32)
    try:
        llnp.fill_next_token_bitmask(matcher, row, 0)
        words = np.flatnonzero(row[0])
        if len(words) == 0:
            return False
        word = int(row[0, words[0]]) & 0xFFFFFFFF
        first = 32 * int(words[0]) + (word & -word).bit_length() - 1  # its lowest set bit
        return int(matcher.validate_tokens([first])) == 1
    except BaseException as exc:
        _reraise_exits(exc)
        return False


def _reraise_exits(exc: BaseException) -> None:
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        raise exc
