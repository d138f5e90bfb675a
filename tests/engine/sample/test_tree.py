"""Tree helpers: paths, positions, visibility / attention mask, and the trie built from chains."""

from __future__ import annotations

import pytest
import torch

from engine.outputs import DraftTree
from engine.runner.input_batch import tree_attention_mask as input_tree_mask
from engine.sample.tree import ancestors, children, path_to, tree_positions, visible_rows
from engine.speculation.proposers.tree_builders import trie_of


def tree_attention_mask(tree: DraftTree) -> torch.Tensor:
    """The mask over [root, nodes...]: the root is the request's one real token."""
    return input_tree_mask(1, tree)


#        root
#       /    \
#     0        1
#     |       / \
#     2      3   4
#            |
#            5
TREE = DraftTree(token_ids=(10, 11, 12, 13, 14, 15), parent_ids=(None, None, 0, 1, 1, 3))


def test_ancestors_and_paths():
    assert ancestors(TREE, 5) == [3, 1]
    assert ancestors(TREE, 0) == []
    assert path_to(TREE, 5) == [1, 3, 5]
    assert path_to(TREE, 2) == [0, 2]
    assert path_to(TREE, None) == []


def test_children_keep_index_order():
    root_children, node_children = children(TREE)
    assert root_children == [0, 1]
    assert node_children == [[2], [3, 4], [], [5], [], []]


def test_positions_over_root_and_nodes():
    # 7 verified tokens: root at 6, depth-1 nodes at 7, depth-2 at 8, depth-3 at 9.
    assert tree_positions(TREE, 7) == [6, 7, 7, 8, 8, 8, 9]


def test_visible_rows_and_mask():
    assert visible_rows(TREE)[6] == [0, 2, 4, 6]  # node 5: root, node 1, node 3, itself
    mask = tree_attention_mask(TREE)
    assert mask.shape == (7, 7) and mask.dtype == torch.bool
    expected = torch.zeros(7, 7, dtype=torch.bool)
    for row, visible in enumerate([[0], [0, 1], [0, 2], [0, 1, 3], [0, 2, 4], [0, 2, 5]]):
        expected[row, visible] = True
    expected[6, [0, 2, 4, 6]] = True
    assert torch.equal(mask, expected)


def test_mask_of_a_chain_is_causal():
    chain = DraftTree(token_ids=(1, 2, 3), parent_ids=(None, 0, 1))
    assert torch.equal(tree_attention_mask(chain), torch.ones(4, 4, dtype=torch.bool).tril())


def test_trie_merges_common_prefixes_in_order():
    tree = trie_of([[5, 6, 7], [5, 6, 8], [9], [5, 1]], 100)
    assert tree.token_ids == (5, 6, 7, 8, 9, 1)
    assert tree.parent_ids == (None, 0, 1, 1, None, 0)


def test_trie_dedupes_siblings_and_splits_the_budget():
    tree = trie_of([[3, 4], [3, 4], [3, 4, 5]], 100)
    assert tree == DraftTree(token_ids=(3, 4, 5), parent_ids=(None, 0, 1))
    # 4 nodes: the best chain may add 2 first, the next 1, then the best one is extended.
    cut = trie_of([[1, 2, 3], [4, 5]], 4)
    assert cut == DraftTree(token_ids=(1, 2, 4, 3), parent_ids=(None, 0, None, 1))
    assert trie_of([], 5).num_nodes == 0


def test_invalid_parent_order_is_rejected():
    with pytest.raises(ValueError, match="must precede"):
        DraftTree(token_ids=(1, 2), parent_ids=(1, None))
