"""N-gram (prompt lookup) proposer: draft what followed an earlier occurrence of the suffix.

For n from ngram_max down to ngram_min, the last n tokens of the request's prompt + verified
output are looked up among earlier occurrences; the tokens that followed become the draft.
Longer n wins (a longer match predicts better); within one n, the most recent occurrence with
a full-length continuation wins, then the occurrences whose continuation is cut short by the
end of the context, longest first.

Each request keeps an incremental index (n-gram -> ascending end positions) in its memos. It is
synced from ProposeRequest.token_ids, adding only the tokens appended since the last step, so a
step never rescans the context. The index is native (kernels/cpu/ngram_index.py) where the CPU
extension loads, else NgramIndex below, its reference. Deterministic drafts: the verifier treats
q as a point mass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engine.config import SpecConfig
from engine.outputs import Drafts, DraftTree
from engine.speculation.proposers.proposer import Observation, ProposeRequest, collect_drafts
from engine.speculation.proposers.tree_builders import TemplateNode, fill_template, trie_of

MAX_TREE_CANDIDATES = 8  # distinct match positions merged into one tree


class NgramIndex:
    """One request's tokens and, for every n-gram (ngram_min <= n <= ngram_max), the end
    positions of its occurrences: ends[key] ascending, where tokens[end - n : end] == key."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.token_ids: list[int] = []
        self._ends: dict[tuple[int, ...], list[int]] = {}

    def sync(self, token_ids: Sequence[int]) -> None:
        """Index the tokens appended since the last sync (verified tokens only grow)."""
        if len(token_ids) < len(self.token_ids):
            self.token_ids, self._ends = [], {}
        for token_id in token_ids[len(self.token_ids) :]:
            self._append(int(token_id))

    def _append(self, token_id: int) -> None:
        tokens = self.token_ids
        tokens.append(token_id)
        end = len(tokens)
        tail = tuple(tokens[-self.ngram_max :])
        ends = self._ends
        for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
            key = tail[-n:]
            found = ends.get(key)
            if found is None:
                ends[key] = [end]
            else:
                found.append(end)

    def __len__(self) -> int:
        return len(self.token_ids)

    def tokens_between(self, start: int, end: int) -> list[int]:
        return self.token_ids[start:end]

    def best_match(self, num_draft_tokens: int) -> tuple[int, int]:
        """(candidate_ends(num_draft_tokens, 1)[0], the match's order n) in one pass; (0, 0)
        with no match. The order is the largest n whose suffix n-gram occurred before (its own
        occurrence ends at the last token; another is a match), and that n-gram also gives the
        first end: every earlier occurrence is a candidate, full-length or cut short."""
        tokens = self.token_ids
        tail = tuple(tokens[-self.ngram_max :])
        for n in range(min(self.ngram_max, len(tokens)), self.ngram_min - 1, -1):
            ends = self._ends.get(tail[-n:])
            if ends is not None and len(ends) >= 2:
                return _order_ends(ends, len(tokens), num_draft_tokens, 1)[0], n
        return 0, 0

    def candidate_ends(self, num_draft_tokens: int, limit: int) -> list[int]:
        """Up to `limit` distinct earlier match ends, best first (see the module docstring)."""
        num_tokens = len(self.token_ids)
        chosen: list[int] = []
        top_n = min(self.ngram_max, num_tokens)
        for n in range(top_n, self.ngram_min - 1, -1):
            ends = self._ends.get(tuple(self.token_ids[num_tokens - n :]), ())
            for end in _order_ends(ends, num_tokens, num_draft_tokens, limit):
                if end not in chosen:
                    chosen.append(end)
            if len(chosen) >= limit:
                break
        return chosen[:limit]


def _order_ends(
    ends: Sequence[int], num_tokens: int, num_draft_tokens: int, limit: int
) -> list[int]:
    """Most recent full-length continuations first, then cut-short ones, longest first.

    ends[-1] == num_tokens is the suffix itself, not an earlier occurrence, so it is skipped
    (without copying the list). Walks backwards and stops after `limit` full ones; at most
    num_draft_tokens ends can be cut short (they lie in the last num_draft_tokens positions).
    """
    full: list[int] = []
    short: list[int] = []
    for i in range(len(ends) - 2, -1, -1):
        end = ends[i]
        if end + num_draft_tokens <= num_tokens:
            full.append(end)
            if len(full) >= limit:
                break
        else:
            short.append(end)
    short.reverse()
    return full + short


class NgramProposer:
    """Prompt-lookup drafts, chains or trees, from per-request incremental n-gram indexes."""

    name = "ngram"
    target_topk = 0  # needs none of the target's top ids
    observes = False  # observe() does nothing: the index syncs from ProposeRequest.token_ids

    def __init__(
        self,
        ngram_min: int = 1,
        ngram_max: int = 4,
        max_tree_candidates: int = MAX_TREE_CANDIDATES,
    ) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.max_tree_candidates = max_tree_candidates

    @classmethod
    def from_config(cls, config: SpecConfig, **runtime: Any) -> NgramProposer:
        return cls(ngram_min=config.ngram_min, ngram_max=config.ngram_max)

    def propose(self, requests: Sequence[ProposeRequest]) -> Drafts:
        return collect_drafts(
            requests,
            lambda r: _best_chain(self._index(r.memos, r.token_ids), r.num_draft_tokens)[0],
            lambda r: self._propose_tree(
                self._index(r.memos, r.token_ids), r.num_draft_tokens, r.tree_template
            ),
        )

    def offer(
        self, memos: dict, token_ids: Sequence[int], num_draft_tokens: int, tree: bool
    ) -> tuple[int, str]:
        """(the most drafts propose() would give the request now, 0 without a match; the
        match's kind, "n<order>"), asked before the plan, so a policy neither plans drafts
        that cannot come nor counts their absence as rejections, and estimates acceptance per
        matched order: a longer match predicts far better (SmolLM2 on chat, greedy: a 1-gram
        match's k = 4 chain got 0.34 tokens accepted, a 4-gram's 2.5; docs/benchmarks.md §4f).
        Syncs the index; a chain is as long as its match's continuation."""
        index = self._index(memos, token_ids)
        end, order = index.best_match(num_draft_tokens)
        if not order:
            return 0, ""
        return (
            num_draft_tokens if tree else min(num_draft_tokens, len(token_ids) - end)
        ), f"n{order}"

    def shadow_chain(
        self, memos: dict, token_ids: Sequence[int], num_draft_tokens: int
    ) -> tuple[list[int], str]:
        """The chain propose() would give the request now and offer()'s kind, from one lookup:
        what a shadow check needs (engine/speculation/shadow.py), without the ProposeRequest
        and Drafts around it. Syncs the index."""
        chain, order = _best_chain(self._index(memos, token_ids), num_draft_tokens)
        return chain, f"n{order}" if order else ""

    def observe(self, observations: Sequence[Observation]) -> None:
        """Nothing to do: the index syncs from ProposeRequest.token_ids, which carries the
        verified tokens (and the prompt, which observe never sees)."""

    def _index(self, memos: dict, token_ids: Sequence[int]) -> NgramIndex:
        """The request's index, synced to its tokens."""
        index = self._index_of(memos)
        index.sync(token_ids)
        return index

    def _index_of(self, memos: dict) -> NgramIndex:
        index = memos.get(self.name)
        if index is None:
            # imported here: kernels.cpu imports torch, and this module stays plain Python
            from kernels.cpu.ngram_index import native_ngram_index

            index = native_ngram_index(self.ngram_min, self.ngram_max)
            if index is None:  # (an empty index is falsy: it has a length)
                index = NgramIndex(self.ngram_min, self.ngram_max)
            memos[self.name] = index
        return index

    def _propose_tree(
        self, index: NgramIndex, num_nodes: int, template: Sequence[TemplateNode] = ()
    ) -> DraftTree:
        ends = index.candidate_ends(num_nodes, self.max_tree_candidates)
        continuations = [index.tokens_between(end, end + num_nodes) for end in ends]
        if template:
            return fill_template(trie_of(continuations, 1 << 30), template, num_nodes)
        return trie_of(continuations, num_nodes)


def _best_chain(index: NgramIndex, num_draft_tokens: int) -> tuple[list[int], int]:
    """(the continuation of the best match, up to num_draft_tokens long; the match's order),
    ([], 0) without a match: a chain proposal, and a shadow check's."""
    end, order = index.best_match(num_draft_tokens)
    if not order:
        return [], 0
    return index.tokens_between(end, end + num_draft_tokens), order
