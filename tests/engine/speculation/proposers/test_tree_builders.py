"""TreeBuilder: best-first draft trees under a node budget (pure Python, no model)."""

from __future__ import annotations

import pytest

from engine.speculation.proposers.tree_builders import TreeBuilder


def test_tree_builder_adds_the_most_probable_nodes_first():
    builder = TreeBuilder(budget=4)
    builder.add_candidates(None, [7, 8, 9, 3], [0.6, 0.3, 0.1, 0.0])  # zero mass: never
    assert builder.pop() == 0 and builder.path(0) == [7]
    builder.add_candidates(0, [1, 2], [0.9, 0.1])  # 7 -> 1 scores 0.54, 7 -> 2 scores 0.06
    assert builder.pop() == 1 and builder.path(1) == [7, 1]
    assert builder.pop() == 2 and builder.path(2) == [8]  # 8 (0.3) is now the best candidate
    builder.add_candidates(2, [5], [0.5])  # 8 -> 5 scores 0.15 and beats 9's 0.1
    assert builder.pop() == 3 and builder.path(3) == [8, 5]
    assert builder.num_left == 0 and builder.pop() is None  # budget used up
    tree = builder.tree()
    assert tree.token_ids == (7, 1, 8, 5) and tree.parent_ids == (None, 0, None, 2)
    assert builder.scores == pytest.approx([0.6, 0.54, 0.3, 0.15])


def test_tree_builder_stops_when_no_candidate_is_left():
    builder = TreeBuilder(budget=5)
    builder.add_candidates(None, [4, 6], [0.75, 0.25])
    assert [builder.pop(), builder.pop(), builder.pop()] == [0, 1, None]
    assert builder.tree().token_ids == (4, 6) and builder.num_left == 3
