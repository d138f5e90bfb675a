"""Tree shapes from measured acceptance (tree_shape.py): the best-first template, learning
p(depth, rank) from verified trees, filling a template from a candidate trie, and the path
a verified tree's emitted tokens walked."""

from __future__ import annotations

from engine.outputs import DraftTree
from engine.speculation.control.tree_shape import PRIOR, TreeShapeEstimator, accepted_path
from engine.speculation.proposers.tree_builders import best_first_template, fill_template, trie_of


def test_template_is_best_first_topological_and_wider_near_the_root():
    template, scores = best_first_template(lambda depth, rank: PRIOR[rank], 200)
    children: dict[int | None, list[int]] = {}
    for slot, (parent, rank) in enumerate(template):
        assert parent is None or parent < slot
        expected = (1.0 if parent is None else scores[parent]) * PRIOR[rank]
        assert abs(scores[slot] - expected) < 1e-12
        children.setdefault(parent, []).append(rank)
    assert scores == sorted(scores, reverse=True)
    for ranks in children.values():
        assert ranks == list(range(len(ranks)))  # siblings: ranks 0..m-1, in order
    assert len(children[None]) == max(len(ranks) for ranks in children.values())
    assert template[:3] == [(None, 0), (0, 0), (None, 1)]
    assert best_first_template(lambda depth, rank: 0.0, 5) == ([], [])


def test_estimator_learns_which_ranks_and_depths_pay():
    """Trees whose second-ranked root child is always the right one: p(1, 1) overtakes
    p(1, 0), and the learned template starts with that child and its rank-0 descendants."""
    estimator = TreeShapeEstimator()
    tree = DraftTree(token_ids=(10, 11, 12, 13), parent_ids=(None, None, 1, 2))
    for _ in range(200):
        estimator.observe(tree, [1, 2, 3])  # root's rank-1 child, then rank 0, rank 0
    assert estimator.probability(1, 1) > 0.9 > estimator.probability(1, 0)
    assert estimator.probability(2, 0) > 0.9 and estimator.probability(3, 0) > 0.9
    template, scores = estimator.template(4)
    assert template[:3] == [(None, 1), (0, 0), (1, 0)]
    assert len(template) == 4 and scores == sorted(scores, reverse=True)
    fresh, _ = TreeShapeEstimator().template(4)
    assert fresh != template  # evidence changed the shape


def test_fill_template_takes_the_ranked_children_of_filled_slots():
    candidates = trie_of([[5, 6, 7], [5, 8], [9, 6]], 1 << 30)  # root -> 5 (6 -> 7, 8), 9 -> 6
    template = [(None, 0), (0, 0), (None, 1), (1, 0), (0, 1), (2, 0), (None, 2)]
    tree = fill_template(candidates, template, 10)
    # slot 0: 5; slot 1: 5's first child 6; slot 2: 9; slot 3: 6's child 7; slot 4: 5's
    # second child 8; slot 5: 9's child 6; slot 6: no third root child.
    assert sorted(zip(tree.token_ids, tree.parent_ids), key=str) == sorted(
        zip((5, 6, 7, 8, 9, 6), (None, 0, 1, 0, None, 4)), key=str
    )
    assert fill_template(candidates, template, 2).num_nodes == 2


def test_accepted_path_follows_the_emitted_tokens():
    tree = DraftTree(token_ids=(10, 11, 12, 13), parent_ids=(None, None, 1, 2))
    assert accepted_path(tree, [11, 12, 99]) == [1, 2]
    assert accepted_path(tree, [11, 12, 13, 7]) == [1, 2, 3]
    assert accepted_path(tree, [42]) == []


def test_a_skipped_rank_does_not_shift_the_credit_of_later_ones():
    """A template holding root ranks 0 and 2 (rank 1 skipped): when the rank-2 candidate is
    the accepted one, p(1, 2) rises and p(1, 1) is untouched (it was never offered)."""
    candidates = trie_of([[5], [6], [7]], 1 << 30)  # root children 5, 6, 7: ranks 0, 1, 2
    tree = fill_template(candidates, [(None, 0), (None, 2)], 2)
    assert tree.token_ids == (5, 7) and tree.ranks == (0, 2)
    estimator = TreeShapeEstimator()
    before = [estimator.probability(1, r) for r in range(3)]
    for _ in range(50):
        estimator.observe(tree, accepted_path(tree, [7, 99]))
    assert estimator.probability(1, 2) > 0.8 > before[2]
    assert estimator.probability(1, 1) == before[1]
    assert estimator.probability(1, 0) < before[0]


def test_recycled_trees_carry_the_candidate_rank_of_each_node():
    """Token Recycling skips a rank whose token repeats a sibling's: the node keeps its rank."""
    from engine.speculation.proposers.recycle import RecycleProposer

    proposer = RecycleProposer(vocab_size=16, num_candidates=3)
    proposer.adjacency[1], proposer.row_lengths[1] = [4, 4, 9], 3  # rank 1 repeats rank 0
    tree = proposer.grow_tree(1, 3, [(None, 0), (None, 1), (None, 2)])
    assert tree.token_ids == (4, 9) and tree.ranks == (0, 2)
