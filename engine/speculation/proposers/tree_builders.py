"""TreeBuilder: best-first growth of one request's draft tree under a node budget. Pure Python.

A node's score is its cumulative draft probability, the product of the draft's probabilities
along the path from the root. Each `pop` adds the best-scoring frontier candidate (a child of
the root or of an existing node) as a node, so the tree ends up holding the `budget`
highest-scoring nodes reachable from the root (the dynamic trees of EAGLE-2, Li et al. 2024).
Nodes are appended in the order chosen: parents precede children, and among siblings the more
probable one comes first, which is the order the sampled tree verifier tries them in.

Candidates for a node's children need the draft's distribution at that node, one draft
forward, so the proposer expands a node only while the budget has room for its children; the
last node added is never expanded.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from engine.sample.tree import DraftTree


class TreeBuilder:
    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.token_ids: list[int] = []
        self.parent_ids: list[int | None] = []
        self.scores: list[float] = []
        # (-score, insertion order, parent node or None for the root, token id)
        self._frontier: list[tuple[float, int, int | None, int]] = []
        self._num_pushed = 0

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    @property
    def num_left(self) -> int:
        return self.budget - self.num_nodes

    def add_candidates(
        self, parent: int | None, token_ids: Sequence[int], probs: Sequence[float]
    ) -> None:
        """Children candidates of `parent` (None: the root) with their draft probabilities."""
        base = 1.0 if parent is None else self.scores[parent]
        for token_id, prob in zip(token_ids, probs):
            if prob > 0:
                heapq.heappush(self._frontier, (-base * prob, self._num_pushed, parent, token_id))
                self._num_pushed += 1

    def pop(self) -> int | None:
        """Add the best frontier candidate as a node and return its index; None when the
        budget is used up or no candidate is left."""
        if self.num_left <= 0 or not self._frontier:
            return None
        negative_score, _, parent, token_id = heapq.heappop(self._frontier)
        self.token_ids.append(token_id)
        self.parent_ids.append(parent)
        self.scores.append(-negative_score)
        return self.num_nodes - 1

    def path(self, node: int | None) -> list[int]:
        """Token ids from the root's child down to `node` inclusive; [] for the root."""
        tokens: list[int] = []
        while node is not None:
            tokens.append(self.token_ids[node])
            node = self.parent_ids[node]
        return tokens[::-1]

    def tree(self) -> DraftTree:
        return DraftTree(tuple(self.token_ids), tuple(self.parent_ids))
