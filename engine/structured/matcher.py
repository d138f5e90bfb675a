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


def _reraise_exits(exc: BaseException) -> None:
    if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
        raise exc
