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

from collections.abc import Sequence

from engine.outputs import DraftTree
from engine.sample.tree import children
from engine.speculation.proposers.tree_builders import MAX_RANK, TemplateNode, best_first_template

MAX_DEPTH = 16
PRIOR = (0.5, 0.16, 0.08, 0.05, 0.035, 0.025, 0.02, 0.015)  # p(., r) before any evidence
PRIOR_WEIGHT = 4.0  # pseudo-trials per (depth, rank)


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
        """One verified tree: offered ranks at every depth the accepted path reached. A node's
        rank is the proposer's (tree.ranks), not its index among the siblings offered: a
        skipped rank must not shift the later ones."""
        root_children, node_children = children(tree)
        offered, depth = root_children, 1
        path = list(accepted_node_ids)
        while offered and depth <= MAX_DEPTH:
            accepted = path[depth - 1] if depth <= len(path) else None
            for index, node in enumerate(offered):
                rank = index if tree.ranks is None else tree.ranks[node]
                if rank < MAX_RANK:
                    self._count(depth, rank, node == accepted)
            if accepted is None:
                break
            offered, depth = node_children[accepted], depth + 1
        self._cache = None

    def _count(self, depth: int, rank: int, success: bool) -> None:
        d = depth - 1
        self._trials[d][rank] = self.decay * self._trials[d][rank] + 1.0
        self._successes[d][rank] = self.decay * self._successes[d][rank] + float(success)


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
