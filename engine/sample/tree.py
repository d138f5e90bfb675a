"""Geometry of a DraftTree (engine/outputs.py): ancestors, paths, children, positions, the rows
each row sees. A tree hangs off the request's last verified token (the root).

Nodes are in topological order: parent_ids[i] < i, and parent_ids[i] is None for children of
the root. With prefix_len verified tokens the root sits at position prefix_len - 1 and node i
at prefix_len - 1 + depth(i) (children of the root have depth 1).

Rows over a tree (target logits, attention mask, positions) are ordered [root, node 0, node 1,
...]: row 0 is the root, row i + 1 is node i. Siblings keep their order: the sampled tree
verifier tries a node's children in index order. This module stays pure Python (proposers
use it too); the torch attention mask is built in engine/runner/input_batch.py from visible_rows.
"""

from __future__ import annotations

from engine.outputs import DraftTree


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
