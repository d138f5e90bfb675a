"""DraftTree: a speculation tree over the request's last verified token (the root).

Nodes are in topological order: parent_ids[i] < i, and parent_ids[i] is None for children of
the root. With prefix_len verified tokens the root sits at position prefix_len - 1 and node i
at prefix_len - 1 + depth(i) (children of the root have depth 1).

Rows over a tree (target logits, attention mask, positions) are ordered [root, node 0, node 1,
...]: row 0 is the root, row i + 1 is node i. Siblings keep their order: the sampled tree
verifier tries a node's children in index order. This module stays pure Python (proposers
import it); the torch attention mask is built in engine.runner.input_batch from visible_rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    token_ids: tuple[int, ...]
    parent_ids: tuple[int | None, ...]

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.parent_ids):
            raise ValueError("token_ids and parent_ids must have the same length")
        for i, parent in enumerate(self.parent_ids):
            if parent is not None and not 0 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must precede it")

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Depth of each node; children of the root have depth 1."""
        depths: list[int] = []
        for parent in self.parent_ids:
            depths.append(1 if parent is None else depths[parent] + 1)
        return depths


def ancestors(tree: DraftTree, node: int) -> list[int]:
    """Node indices strictly above `node`, nearest first; the root (not a node) is excluded."""
    result: list[int] = []
    parent = tree.parent_ids[node]
    while parent is not None:
        result.append(parent)
        parent = tree.parent_ids[parent]
    return result


def path_to(tree: DraftTree, node: int | None) -> list[int]:
    """Node indices from the root's child down to `node` inclusive; [] for the root (None)."""
    if node is None:
        return []
    return [*reversed(ancestors(tree, node)), node]


def children(tree: DraftTree) -> tuple[list[int], list[list[int]]]:
    """(children of the root, children of each node), each list in index (= trial) order."""
    root_children: list[int] = []
    node_children: list[list[int]] = [[] for _ in tree.parent_ids]
    for node, parent in enumerate(tree.parent_ids):
        (root_children if parent is None else node_children[parent]).append(node)
    return root_children, node_children


def tree_positions(tree: DraftTree, prefix_len: int) -> list[int]:
    """Positions of the rows [root, node 0, ...] when prefix_len tokens are verified."""
    return [prefix_len - 1] + [prefix_len - 1 + depth for depth in tree.depths()]


def visible_rows(tree: DraftTree) -> list[list[int]]:
    """For each row of [root, nodes...], the rows it attends to: the root, its ancestors, itself.

    The tree attention mask is mask[i, j] = j in visible_rows(tree)[i] (history before the root
    is always visible and not part of these rows).
    """
    rows: list[list[int]] = [[0]]
    for node, parent in enumerate(tree.parent_ids):
        rows.append(rows[0 if parent is None else parent + 1] + [node + 1])
    return rows


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
