"""Token Recycling: adjacency updates from observe, chain and tree drafts from the template."""

from __future__ import annotations

import random

import pytest

from engine.config import SpecConfig
from engine.speculation.proposers.recycle import RecycleProposer
from tests.engine.factories import request_state_in
from tests.engine.speculation.proposers.asks import ask, fresh_memos, memos, observation  # noqa: F401

VOCAB = 64


def full_adjacency(proposer: RecycleProposer, seed: int = 0) -> None:
    """Observe every row once, with k distinct random candidates (as a real top-k has)."""
    rng = random.Random(seed)
    for token_id in range(proposer.vocab_size):
        proposer._update_row(token_id, rng.sample(range(proposer.vocab_size), k=8))


def propose_one(proposer: RecycleProposer, token_ids: list[int], budget: int, tree: bool):
    drafts = proposer.propose([ask("r", token_ids, budget, tree=tree)])
    return drafts.trees.get("r") if tree else drafts.chains.get("r", [])


def test_observe_updates_the_input_tokens_rows():
    proposer = RecycleProposer(VOCAB)
    assert propose_one(proposer, [3, 4, 5], 4, tree=False) == []  # root 5 never observed
    # Verified 10, 11 after root 5: topk[0] came from 5's row, topk[1] from 10's row.
    proposer.observe([observation("r", [10, 11], [(10, 20, 30), (11, 21)])])
    assert proposer.candidates(5) == [10, 20, 30]
    assert proposer.candidates(10) == [11, 21]
    assert proposer.candidates(11) == []
    # The next observe continues from root 11; a newer top-k replaces the old row.
    proposer.observe([observation("r", [12], [(12, 22)])])
    proposer.observe([observation("r", [13], [(13,)])])
    assert proposer.candidates(11) == [12, 22] and proposer.candidates(12) == [13]
    proposer.observe([observation("r", [14], [(40, 41)])])
    proposer.observe([observation("r", [15], [(50, 51)])])
    proposer.observe([observation("r", [16], [(60,)])])
    assert proposer.candidates(13) == [40, 41]


def test_observe_without_root_or_topk_only_moves_the_root():
    proposer = RecycleProposer(VOCAB)
    # The first token's input row is unknown (no root seen yet): skipped.
    proposer.observe([observation("r", [7, 8], [(7, 1), (8, 2)])])
    assert proposer.candidates(7) == [8, 2]
    assert int(proposer.row_lengths.sum()) == 2
    proposer.observe([observation("r", [9], None)])
    proposer.observe([observation("r", [10], [(10,)])])
    assert proposer.candidates(9) == [10]
    assert proposer.candidates(8) == []


def test_observe_truncates_to_k_and_ignores_out_of_vocab():
    proposer = RecycleProposer(VOCAB, num_candidates=4)
    proposer.propose([ask("r", [1], 0)])  # records root 1
    proposer.observe([observation("r", [2], [(2, 3, 999, 4, 5, 6)])])
    assert proposer.candidates(1) == [2, 3, 4, 5]
    # An out-of-vocab input row is ignored, not a crash.
    proposer.observe([observation("r", [999], [(1,)])])
    assert proposer.candidates(999) == []


def test_chain_follows_top1_until_an_unseen_row():
    proposer = RecycleProposer(VOCAB)
    for token_id, top1 in [(1, 2), (2, 3), (3, 4)]:
        proposer._update_row(token_id, [top1, 60])
    assert propose_one(proposer, [9, 1], 10, tree=False) == [2, 3, 4]
    assert propose_one(proposer, [9, 1], 2, tree=False) == [2, 3]
    proposer._update_row(4, [1])  # a cycle 1 -> 2 -> 3 -> 4 -> 1 is followed up to the budget
    assert propose_one(proposer, [1], 6, tree=False) == [2, 3, 4, 1, 2, 3]


def check_tree_against_adjacency(proposer: RecycleProposer, root_id: int, tree) -> None:
    depths = tree.depths()
    assert depths == sorted(depths), "not breadth-first"
    children: dict[int | None, list[int]] = {}
    for node, parent in enumerate(tree.parent_ids):
        assert parent is None or parent < node
        children.setdefault(parent, []).append(tree.token_ids[node])
    for parent, tokens in children.items():
        parent_token = root_id if parent is None else tree.token_ids[parent]
        assert len(set(tokens)) == len(tokens), "siblings share a token"
        distinct = list(dict.fromkeys(proposer.candidates(parent_token)))
        assert tokens == distinct[: len(tokens)]


@pytest.mark.parametrize("budget", [1, 2, 5, 16, 64, 256])
def test_tree_fills_the_budget_from_a_full_adjacency(budget):
    proposer = RecycleProposer(VOCAB)
    full_adjacency(proposer)
    tree = propose_one(proposer, [0, 17], budget, tree=True)
    assert tree.num_nodes == budget
    check_tree_against_adjacency(proposer, 17, tree)
    if budget >= 16:
        root_children = sum(1 for parent in tree.parent_ids if parent is None)
        assert root_children >= 3 and max(tree.depths()) >= 4  # wide near the root, deep on top-1


def test_tree_drops_unseen_rows_and_duplicate_siblings():
    proposer = RecycleProposer(VOCAB)
    proposer._update_row(1, [2, 3, 2, 4])
    assert proposer.candidates(1) == [2, 3, 4]  # observe keeps the first of duplicates
    proposer.adjacency[1, :4] = [2, 3, 2, 4]  # a row written with a duplicate anyway
    proposer.row_lengths[1] = 4
    proposer._update_row(2, [5])
    tree = propose_one(proposer, [1], 32, tree=True)
    assert tree.token_ids == (2, 3, 4, 5)
    assert tree.parent_ids == (None, None, None, 0)
    check_tree_against_adjacency(proposer, 1, tree)
    assert propose_one(proposer, [33], 32, tree=True) is None  # unseen root: no drafts


def test_adjacency_memory_matches_the_paper_for_smollm2_vocab():
    proposer = RecycleProposer(49152)
    assert proposer.num_bytes < 2 * 2**20


def test_from_config_needs_vocab_size_and_validates_prior():
    with pytest.raises(ValueError, match="vocab_size"):
        RecycleProposer.from_config(SpecConfig(proposer="recycle"))
    assert RecycleProposer.from_config(SpecConfig(), vocab_size=10).adjacency.shape == (10, 8)
    with pytest.raises(ValueError, match="non-increasing"):
        RecycleProposer(10, num_candidates=2, rank_prior=(0.1, 0.5))
    with pytest.raises(ValueError, match="num_candidates"):
        RecycleProposer(10, num_candidates=9)


def test_dropped_memos_forget_the_root_but_keep_the_shared_adjacency():
    proposer = RecycleProposer(VOCAB)
    proposer.propose([ask("r", [1], 4)])
    proposer.observe([observation("r", [2], [(2, 3)])])
    assert memos("r") == {"recycle": 2} and not request_state_in(proposer, lambda k: k == "r")
    memos("r").clear()  # as the driver does when the request is preempted
    proposer.observe([observation("r", [4], [(9,)])])  # root forgotten: first row update skipped
    assert proposer.candidates(1) == [2, 3] and proposer.candidates(2) == []


def test_rejected_drafts_rows_are_recycled_too():
    """A rejected draft's row still holds the target's top-k after that token."""
    proposer = RecycleProposer(vocab_size=50)
    propose_one(proposer, [3], 2, tree=False)  # remember the root
    drafts_topk = ((30, 31), (40,))
    proposer.observe([observation("r", [7], [[7, 8]], (20, 21), drafts_topk)])
    assert proposer.candidates(3) == [7, 8]  # the emitted token's row, as before
    assert proposer.candidates(20) == [30, 31] and proposer.candidates(21) == [40]
