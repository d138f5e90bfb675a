"""The native n-gram index (csrc/ngram_index.cpp) behind the interface of the pure-Python
NgramIndex (engine/speculation/proposers/ngram.py), which is its fallback and its reference:
sync(token_ids), best_match(k), candidate_ends(k, limit), tokens_between(start, end), len().

Why native: the Python index builds a tuple and a dict entry per order for every token, ~2.4 us a
token and ~0.2 ms for a 100-token prompt (~2 ms for 1,500), work that lands on the step that
first offers or checks a request; at two SmolLM2 requests it was over half the shadow checks'
time (docs/benchmarks.md §5zr).
"""

from __future__ import annotations

from collections.abc import Sequence

from kernels.cpu.build import load_native

MAX_ORDER = 16  # the native index's longest n-gram (csrc/ngram_index.cpp: kMaxOrder)


class NativeNgramIndex:
    """One request's index in native code; the queries are the native object's own methods."""

    __slots__ = ("_index", "best_match", "candidate_ends", "tokens_between")

    def __init__(self, index) -> None:
        self._index = index
        self.best_match = index.best_match
        self.candidate_ends = index.candidate_ends
        self.tokens_between = index.tokens_between

    def __len__(self) -> int:
        return len(self._index)

    def sync(self, token_ids: Sequence[int]) -> None:
        """Index the tokens appended since the last sync (verified tokens only grow; fewer
        start the index again)."""
        index = self._index
        indexed = len(index)
        if len(token_ids) < indexed:
            index.clear()
            indexed = 0
        if len(token_ids) > indexed:
            index.extend(token_ids[indexed:])


def native_ngram_index(ngram_min: int, ngram_max: int) -> NativeNgramIndex | None:
    """A native index for these orders, or None where the extension cannot be had (the caller
    uses the Python index) or the orders are past MAX_ORDER."""
    ops = load_native()
    if ops is None or ngram_max > MAX_ORDER:
        return None
    return NativeNgramIndex(ops.NgramIndex(ngram_min, ngram_max))
