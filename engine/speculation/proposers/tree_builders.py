"""How proposers build DraftTrees (engine/outputs.py). Pure Python.

trie_of: a trie of candidate continuations (n-gram) under a node budget. Templates: (parent
slot, rank) nodes best first by path probability (best_first_template), filled from a proposer's
ranked candidates (fill_template; engine/speculation/control/tree_shape.py learns the
probabilities). TreeBuilder: best-first growth of one request's tree by draft probability:

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
from collections.abc import Callable, Sequence

from engine.outputs import DraftTree
from engine.sample.tree import children

MAX_RANK = 8  # candidates offered per node of a template

TemplateNode = tuple[int | None, int]  # (parent template slot, or None for the root; rank)


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


def trie_of(continuations: Sequence[Sequence[int]], num_nodes: int) -> DraftTree:
    """A trie of the continuations (shared prefixes stored once) with at most num_nodes nodes.

    Budget split, best candidate first: in a first pass candidate i may add up to
    max(1, num_nodes >> (i + 1)) new nodes (half the budget for the best, a quarter for the
    next, ...); a second pass spends what is left extending candidates in the same order.
    Nodes are created parent-first, so creation order is topological.
    """
    token_ids: list[int] = []
    parent_ids: list[int | None] = []
    children: dict[tuple[int | None, int], int] = {}  # (parent node, token) -> node

    def insert(continuation: Sequence[int], max_new_nodes: int) -> None:
        parent: int | None = None
        for token_id in continuation:
            node = children.get((parent, token_id))
            if node is None:
                if max_new_nodes == 0 or len(token_ids) >= num_nodes:
                    return
                node = len(token_ids)
                children[(parent, token_id)] = node
                token_ids.append(token_id)
                parent_ids.append(parent)
                max_new_nodes -= 1
            parent = node

    for i, continuation in enumerate(continuations):
        insert(continuation, max(1, num_nodes >> (i + 1)))
    for continuation in continuations:
        insert(continuation, num_nodes)
    return DraftTree(token_ids=tuple(token_ids), parent_ids=tuple(parent_ids))


def best_first_template(
    probability: Callable[[int, int], float], num_nodes: int
) -> tuple[list[TemplateNode], list[float]]:
    """The num_nodes best nodes by path probability, best first, and their probabilities.

    Best-first enumeration: popping a node offers each rank of its children. A child never
    scores above its parent (probability <= 1), so the order is topological.
    """
    heap: list[tuple[float, int, int | None, int, int]] = []
    pushed = 0  # tie-breaker: earlier pushes win, keeping the enumeration deterministic

    def offer(parent: int | None, depth: int, parent_score: float) -> None:
        nonlocal pushed
        for rank in range(MAX_RANK):
            score = parent_score * probability(depth, rank)
            if score > 0.0:
                heapq.heappush(heap, (-score, pushed, parent, rank, depth))
                pushed += 1

    template: list[TemplateNode] = []
    scores: list[float] = []
    offer(None, 1, 1.0)
    while heap and len(template) < num_nodes:
        negative, _, parent, rank, depth = heapq.heappop(heap)
        template.append((parent, rank))
        scores.append(-negative)
        offer(len(template) - 1, depth + 1, -negative)
    return template, scores


def fill_template(
    candidates: DraftTree, template: Sequence[TemplateNode], num_nodes: int
) -> DraftTree:
    """The template's nodes that `candidates` (a trie of every candidate, siblings in rank
    order) holds, at most num_nodes, parents first: template slot (parent, r) takes the
    r-th child of the node that filled the parent slot; a slot with no such child (or whose
    parent was not filled) stays empty."""
    _, node_children = children(candidates)
    root_children = children(candidates)[0]
    filled: dict[int, int] = {}  # template slot -> node of `candidates`
    rank_of: dict[int, int] = {}  # node of `candidates` -> its rank among its siblings
    for slot, (parent_slot, rank) in enumerate(template):
        if len(filled) >= num_nodes:
            break
        if parent_slot is not None and parent_slot not in filled:
            continue
        offered = root_children if parent_slot is None else node_children[filled[parent_slot]]
        if rank < len(offered):
            filled[slot] = offered[rank]
            rank_of[offered[rank]] = rank
    kept = sorted(filled.values())  # candidate order is topological: parents first
    index = {node: i for i, node in enumerate(kept)}
    parents = [candidates.parent_ids[node] for node in kept]
    return DraftTree(
        tuple(candidates.token_ids[node] for node in kept),
        tuple(None if parent is None else index[parent] for parent in parents),
        tuple(rank_of[node] for node in kept),
    )
