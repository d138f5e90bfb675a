"""Hand-built verification cases: greedy/sampled chains and trees, on tiny vocabularies."""

from __future__ import annotations

import pytest
import torch

from engine.speculation.tree import DraftTree
from engine.speculation.verify import (
    VerifyResult,
    chain_verify_batch,
    residual,
    tree_verify_batch,
    verify_greedy_chain,
    verify_greedy_tree,
    verify_sampled_chain,
    verify_sampled_tree,
)

V = 6


def one_hot(*token_ids: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token_ids), V).float()


def rows(*dists: list[float]) -> torch.Tensor:
    return torch.tensor(dists, dtype=torch.float32)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---- greedy chain ---------------------------------------------------------------------------


def test_greedy_chain_accepts_all_and_adds_bonus():
    result = verify_greedy_chain([4, 1, 5, 2], [4, 1, 5])
    assert result == VerifyResult((4, 1, 5, 2), (0, 1, 2))
    assert result.num_accepted == 3


def test_greedy_chain_rejects_first():
    assert verify_greedy_chain([3, 1, 5], [4, 1]) == VerifyResult((3,), ())


def test_greedy_chain_rejects_in_the_middle_and_ignores_later_matches():
    assert verify_greedy_chain([4, 0, 5, 2], [4, 1, 5]).token_ids == (4, 0)


def test_greedy_chain_takes_argmax_of_rows_and_no_drafts():
    assert verify_greedy_chain(one_hot(2, 3), [2]).token_ids == (2, 3)
    assert verify_greedy_chain([5], []).token_ids == (5,)
    with pytest.raises(ValueError, match="target rows"):
        verify_greedy_chain([1, 2], [1, 2])


# ---- greedy tree ----------------------------------------------------------------------------
#        root
#       /    \
#   0:a=1    1:b=2
#     |      /    \
#   2:c=3  3:d=4  4:e=4
#             |
#           5:f=0
TREE = DraftTree(token_ids=(1, 2, 3, 4, 4, 0), parent_ids=(None, None, 0, 1, 1, 3))


def test_greedy_tree_picks_the_longest_matching_path():
    # argmax at rows [root, n0..n5]: root -> 2 (b), b -> 4 (d/e), d -> 0 (f), f -> 5 (bonus)
    target = [2, 3, 4, 5, 0, 1, 5]
    result = verify_greedy_tree(TREE, target)
    assert result == VerifyResult((2, 4, 0, 5), (1, 3, 5))


def test_greedy_tree_equal_siblings_go_to_the_lower_index():
    target = [2, 3, 4, 5, 1, 3, 5]  # d's child f does not match (d -> 1); d and e tie at depth 2
    result = verify_greedy_tree(TREE, target)
    assert result == VerifyResult((2, 4, 1), (1, 3))


def test_greedy_tree_no_match_and_a_shallow_match():
    assert verify_greedy_tree(TREE, [5, 0, 0, 0, 0, 0, 0]) == VerifyResult((5,), ())
    # a matches but its child c does not: emit a, then the target's token after a.
    assert verify_greedy_tree(TREE, [1, 0, 0, 0, 0, 0, 0]) == VerifyResult((1, 0), (0,))


# ---- sampled chain --------------------------------------------------------------------------


def test_sampled_chain_accepts_all_when_q_equals_p_and_samples_the_bonus_from_p_k():
    p = rows([0.5, 0.5, 0, 0, 0, 0], [0, 0.2, 0.8, 0, 0, 0], [0, 0, 0, 0, 0, 1])
    for seed in range(20):
        result = verify_sampled_chain(p, [1, 2], p[:2].clone(), gen(seed))
        assert result == VerifyResult((1, 2, 5), (0, 1))


def test_sampled_chain_rejects_first_and_corrects_from_the_residual():
    p = rows([0.5, 0.5, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0])
    q = rows([0.9, 0.1, 0, 0, 0, 0])  # residual max(p - q, 0) = [0, 0.4, ...] -> token 1
    outcomes = {verify_sampled_chain(p, [0], q, gen(seed)).token_ids for seed in range(200)}
    assert outcomes == {(0, 0), (1,)}  # accepted (then bonus 0) or corrected to 1, never (0,)


def test_sampled_chain_zero_target_mass_always_rejects():
    p = rows([0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0])
    for seed in range(20):
        assert verify_sampled_chain(p, [2, 1], None, gen(seed)).token_ids == (3,)


def test_sampled_chain_rejects_in_the_middle():
    p = rows([0, 1, 0, 0, 0, 0], [0, 0, 0.5, 0.5, 0, 0], [1, 0, 0, 0, 0, 0])
    q = rows([0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0])  # x1 = 4 has p = 0
    for seed in range(20):
        result = verify_sampled_chain(p, [1, 4], q, gen(seed))
        assert result.accepted_node_ids == (0,)
        assert result.token_ids[0] == 1 and result.token_ids[1] in (2, 3)


def test_deterministic_vs_draft_probability_q():
    """p(x) = 0.5: a point-mass proposer keeps x half the time; a draft with q(x) = 0.5 always."""
    p = rows([0.5, 0.25, 0.25, 0, 0, 0], [0, 0, 0, 0, 0, 1])
    q = rows([0.5, 0, 0, 0.5, 0, 0])
    deterministic = [verify_sampled_chain(p, [0], None, gen(s)).num_accepted for s in range(400)]
    with_q = [verify_sampled_chain(p, [0], q, gen(s)).num_accepted for s in range(400)]
    assert all(with_q)
    assert 0.4 < sum(deterministic) / 400 < 0.6  # binomial(400, 0.5): sd 0.025
    # After rejecting a point mass on 0, the correction is 1 or 2, never the rejected token.
    corrections = {verify_sampled_chain(p, [0], None, gen(s)).token_ids for s in range(400)}
    assert corrections == {(0, 5), (1,), (2,)}


def test_sampled_chain_is_reproducible_per_seed_and_checks_shapes():
    p = torch.softmax(torch.randn(4, V, generator=gen(0)), -1)
    first = [verify_sampled_chain(p, [1, 2, 3], None, gen(s)) for s in range(10)]
    assert first == [verify_sampled_chain(p, [1, 2, 3], None, gen(s)) for s in range(10)]
    assert len({r.token_ids for r in first}) > 1
    with pytest.raises(ValueError, match="draft_probs rows"):
        verify_sampled_chain(p, [1, 2, 3], p[:2], gen(0))


def test_public_chain_runs_the_batched_core_with_the_generator_draws():
    """The statistical tests exercise chain_verify_batch; this ties it to verify_sampled_chain."""
    for seed in range(30):
        p = torch.softmax(2 * torch.randn(4, V, generator=gen(100 + seed)), -1)
        q = torch.softmax(2 * torch.randn(3, V, generator=gen(200 + seed)), -1)
        drafts = torch.multinomial(q, 1, generator=gen(seed)).squeeze(-1)
        result = verify_sampled_chain(p, drafts.tolist(), q, gen(seed))
        uniforms = torch.rand((1, 4), dtype=torch.float64, generator=gen(seed))
        num_accepted, token = chain_verify_batch(p[None], drafts[None], q[None], uniforms)
        assert result.num_accepted == num_accepted.item()
        assert result.token_ids[-1] == token.item()


def test_chain_equals_tree_on_a_path():
    """A chain is a tree with one child per node: both verifiers agree draw for draw."""
    path = DraftTree(token_ids=(1, 2, 3), parent_ids=(None, 0, 1))
    for seed in range(50):
        p = torch.softmax(2 * torch.randn(4, V, generator=gen(seed)), -1)
        q = torch.softmax(2 * torch.randn(3, V, generator=gen(seed + 1000)), -1)
        for draft_probs in (q, None):
            chain = verify_sampled_chain(p, [1, 2, 3], draft_probs, gen(seed))
            tree = verify_sampled_tree(path, p, draft_probs, gen(seed))
            assert chain == tree


def test_residual_subtracts_and_falls_back_to_p():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.8, 0.0]])
    q = torch.tensor([[0.9, 0.1, 0.0], [0.2, 0.8, 0.0]])
    assert torch.allclose(residual(p, q), torch.tensor([[0.0, 1.0, 0.0], [0.2, 0.8, 0.0]]))


# ---- sampled tree ---------------------------------------------------------------------------


def test_sampled_tree_tries_siblings_in_order_with_the_residual():
    tree = DraftTree(token_ids=(0, 1), parent_ids=(None, None))
    # p at root: half on 0, half on 1. Child 0 is accepted w.p. 1/2; if rejected, the
    # residual is a point mass on 1, so child 1 is always accepted. The bonus after 1 is 4.
    p = rows([0.5, 0.5, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0])
    results = {verify_sampled_tree(tree, p, None, gen(s)) for s in range(100)}
    assert results == {VerifyResult((0, 3), (0,)), VerifyResult((1, 4), (1,))}


def test_sampled_tree_repeated_sibling_token_is_never_accepted_twice():
    tree = DraftTree(token_ids=(0, 0), parent_ids=(None, None))
    p = rows([0.5, 0.5, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 1, 0])
    results = {verify_sampled_tree(tree, p, None, gen(s)) for s in range(100)}
    assert results == {VerifyResult((0, 3), (0,)), VerifyResult((1,), ())}


def test_sampled_tree_descends_and_samples_the_bonus_at_a_leaf():
    tree = DraftTree(token_ids=(2, 1, 3), parent_ids=(None, None, 1))
    p = rows(
        [0, 1, 0, 0, 0, 0],  # root -> 1: node 0 (2) rejected, node 1 (1) accepted
        [0, 0, 0, 0, 0, 1],  # after node 0 (unused)
        [0, 0, 0, 1, 0, 0],  # after node 1 -> 3: node 2 accepted
        [0, 0, 0, 0, 1, 0],  # after node 2 (a leaf): bonus 4
    )
    q = rows([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0])
    for draft_probs in (None, q):
        assert verify_sampled_tree(tree, p, draft_probs, gen(0)) == VerifyResult((1, 3, 4), (1, 2))


def test_sampled_tree_with_greedy_target_matches_the_greedy_tree():
    for seed in range(20):
        argmax = torch.randint(0, 5, (TREE.num_nodes + 1,), generator=gen(seed))
        sampled = verify_sampled_tree(TREE, one_hot(*argmax.tolist()), None, gen(seed))
        assert sampled == verify_greedy_tree(TREE, argmax.tolist())


def test_tree_batch_handles_trials_with_different_tokens():
    parents = (None, None)
    tokens = torch.tensor([[0, 1], [1, 0]])
    p = torch.stack([rows([0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0])] * 2)
    uniforms = torch.full((2, 3), 0.5, dtype=torch.float64)
    last_node, next_token = tree_verify_batch(p, parents, tokens, None, uniforms)
    assert last_node.tolist() == [1, 0]  # the node holding token 1
    assert next_token.tolist() == [3, 2]


def test_point_mass_tree_fast_path_equals_the_literal_rule():
    """q = None takes a scalar shortcut; it must decide exactly like explicit one-hot q rows."""
    parents = (None, None, None, 0, 0, 1, 3, 3, 2)
    batch, vocab = 2000, 4  # a small vocabulary makes repeated sibling tokens common
    g = gen(0)
    target = torch.softmax(2 * torch.randn(batch, len(parents) + 1, vocab, generator=g), -1)
    tokens = torch.randint(0, vocab, (batch, len(parents)), generator=g)
    uniforms = torch.rand(batch, len(parents) + 1, dtype=torch.float64, generator=g)
    one_hot_q = torch.nn.functional.one_hot(tokens, vocab).float()
    fast = tree_verify_batch(target, parents, tokens, None, uniforms)
    literal = tree_verify_batch(target, parents, tokens, one_hot_q, uniforms)
    assert torch.equal(fast[0], literal[0]) and torch.equal(fast[1], literal[1])
    assert len(set(fast[0].tolist())) == len(parents) + 1  # every node ends some trial


def test_no_drafts_samples_from_the_first_row():
    p = rows([0, 0, 1, 0, 0, 0])
    assert verify_sampled_chain(p, [], None, gen(0)) == VerifyResult((2,), ())
    empty = DraftTree(token_ids=(), parent_ids=())
    assert verify_sampled_tree(empty, p, None, gen(0)) == VerifyResult((2,), ())
    assert verify_greedy_tree(empty, [4]) == VerifyResult((4,), ())
