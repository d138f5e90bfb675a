"""Tree shapes from measured acceptance: which (depth, rank) nodes a draft tree should hold.

A model-free proposer ranks its candidates for the token after a node (Token Recycling: the
target's recycled top-k; n-gram: continuations, best first). p(d, r) is the probability that
the rank-r candidate at depth d is the target's token, given that its parent was accepted and
the proposer offered a rank-r candidate there. Ranks are exclusive (one target token), so a
node's chance of being on the accepted path is the product of p along its path. The tree of n
nodes with the largest expected accepted length holds the n nodes of largest path
probability: a best-first enumeration (a child never scores above its parent), so every prefix
of the template is the best tree of its size — the goodput search picks the size, this picks
the shape. A rank the evidence favours over a better-ranked sibling can come first.

p(d, r) is learned from every verified tree: at each depth the accepted path reached, every
offered rank is a trial and the accepted one (if any) a success; counts decay slowly and start
from a prior (the static prior of the Token Recycling paper's imbalanced tree).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from engine.sample.tree import DraftTree, children

MAX_DEPTH = 16
MAX_RANK = 8
PRIOR = (0.5, 0.16, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015)  # p(., r) before any evidence
PRIOR_WEIGHT = 4.0  # pseudo-trials per (depth, rank)

TemplateNode = tuple[int | None, int]  # (parent template slot, or None for the root; rank)


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


class TreeShapeEstimator:
    """p(depth, rank) from verified trees (module docstring), shared by the proposers that
    fill templates and by the goodput policy that sizes them."""

    def __init__(self, decay: float = 0.999) -> None:
        self.decay = decay
        self._successes = [[p * PRIOR_WEIGHT for p in PRIOR] for _ in range(MAX_DEPTH)]
        self._trials = [[PRIOR_WEIGHT] * MAX_RANK for _ in range(MAX_DEPTH)]
        self._cache: tuple[list[TemplateNode], list[float]] | None = None

    def probability(self, depth: int, rank: int) -> float:
        d, r = min(depth, MAX_DEPTH) - 1, min(rank, MAX_RANK - 1)
        return self._successes[d][r] / self._trials[d][r]

    def template(self, num_nodes: int) -> tuple[list[TemplateNode], list[float]]:
        """The best `num_nodes` template nodes and their path probabilities (cached)."""
        if self._cache is None or len(self._cache[0]) < num_nodes:
            self._cache = best_first_template(self.probability, max(num_nodes, 64))
        template, scores = self._cache
        return template[:num_nodes], scores[:num_nodes]

    def observe(self, tree: DraftTree, accepted_node_ids: Sequence[int]) -> None:
        """One verified tree: offered ranks at every depth the accepted path reached."""
        root_children, node_children = children(tree)
        offered, depth = root_children, 1
        path = list(accepted_node_ids)
        while offered and depth <= MAX_DEPTH:
            accepted = path[depth - 1] if depth <= len(path) else None
            for rank, node in enumerate(offered[:MAX_RANK]):
                self._count(depth, rank, node == accepted)
            if accepted is None:
                break
            offered, depth = node_children[accepted], depth + 1
        self._cache = None

    def _count(self, depth: int, rank: int, success: bool) -> None:
        d = depth - 1
        self._trials[d][rank] = self.decay * self._trials[d][rank] + 1.0
        self._successes[d][rank] = self.decay * self._successes[d][rank] + float(success)


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
    for slot, (parent_slot, rank) in enumerate(template):
        if len(filled) >= num_nodes:
            break
        if parent_slot is not None and parent_slot not in filled:
            continue
        offered = root_children if parent_slot is None else node_children[filled[parent_slot]]
        if rank < len(offered):
            filled[slot] = offered[rank]
    kept = sorted(filled.values())  # candidate order is topological: parents first
    index = {node: i for i, node in enumerate(kept)}
    parents = [candidates.parent_ids[node] for node in kept]
    return DraftTree(
        tuple(candidates.token_ids[node] for node in kept),
        tuple(None if parent is None else index[parent] for parent in parents),
    )


def accepted_path(tree: DraftTree, token_ids: Sequence[int]) -> list[int]:
    """The tree nodes the emitted tokens walked through (accepted drafts, then the
    correction/bonus): from the root, the child whose token is the next emitted one."""
    root_children, node_children = children(tree)
    path, offered = [], root_children
    for token in token_ids[:-1]:
        node = next((n for n in offered if tree.token_ids[n] == token), None)
        if node is None:
            break
        path.append(node)
        offered = node_children[node]
    return path
