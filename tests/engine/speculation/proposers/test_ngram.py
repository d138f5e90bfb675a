"""N-gram proposer: match choice, incremental index == brute-force rescan, tree merging."""

from __future__ import annotations

import random

import pytest

from engine.speculation.proposers.ngram import NgramIndex, NgramProposer
from engine.speculation.proposers.tree_builders import trie_of
from kernels.cpu.ngram_index import NativeNgramIndex, native_ngram_index
from tests.engine.factories import request_state_in
from tests.engine.speculation.proposers.asks import ask, fresh_memos, memos  # noqa: F401


def chain(proposer: NgramProposer, token_ids: list[int], k: int, request_id: str = "r") -> list:
    drafts = proposer.propose([ask(request_id, token_ids, k, tree=False)])
    assert not drafts.trees
    return drafts.chains.get(request_id, [])


def brute_force_ends(token_ids: list[int], n_min: int, n_max: int, k: int, limit: int) -> list[int]:
    """The documented choice, recomputed from scratch by scanning the whole context."""
    num_tokens = len(token_ids)
    chosen: list[int] = []
    for n in range(min(n_max, num_tokens), n_min - 1, -1):
        suffix = token_ids[num_tokens - n :]
        ends = [e for e in range(n, num_tokens) if token_ids[e - n : e] == suffix]
        full = [e for e in reversed(ends) if e + k <= num_tokens]
        short = [e for e in ends if e + k > num_tokens]
        chosen += [e for e in full + short if e not in chosen]
        if len(chosen) >= limit:
            break
    return chosen[:limit]


def test_longest_ngram_wins_over_more_recent_short_match():
    # Suffix (1, 2, 3): the 3-gram occurred at the start (followed by 7); the 1-gram 3
    # occurred more recently (followed by 9).
    token_ids = [1, 2, 3, 7, 8, 5, 3, 9, 6, 1, 2, 3]
    proposer = NgramProposer(ngram_min=1, ngram_max=3)
    assert chain(proposer, token_ids, 2) == [7, 8]
    # With only unigrams allowed, the most recent 3 (followed by 9, 6) wins instead.
    unigrams = NgramProposer(ngram_min=1, ngram_max=1)  # another engine: another request
    assert chain(unigrams, token_ids, 2, "other") == [9, 6]


def test_most_recent_full_continuation_then_longest_short_one():
    token_ids = [5, 1, 2, 5, 3, 4, 5]
    proposer = NgramProposer(ngram_min=1, ngram_max=2)
    assert chain(proposer, token_ids, 2, "a") == [3, 4]  # the later 5 wins
    # k=4: only the first 5 (end 1) has a continuation as long as 4 tokens.
    assert chain(proposer, token_ids, 4, "b") == [1, 2, 5, 3]
    # k=6: no match is long enough; the earliest has the longest continuation (cut short).
    assert chain(proposer, token_ids, 6, "c") == [1, 2, 5, 3, 4, 5]


def test_no_match_or_no_budget_gives_no_drafts():
    proposer = NgramProposer(ngram_min=2, ngram_max=3)
    drafts = proposer.propose(
        [
            ask("fresh", [1, 2, 3, 4, 5], 4, tree=False),
            ask("tree", [1, 2, 3, 4, 5], 4, tree=True),
            ask("zero", [1, 2, 1, 2], 0, tree=False),
            ask("short", [7], 4, tree=False),
        ]
    )
    assert drafts.chains == {} and drafts.trees == {}
    assert drafts.num_draft_tokens("fresh") == 0


def test_offer_is_what_propose_then_drafts():
    """offer() (asked before the plan) says how many drafts propose() gives: 0 without a
    match, a chain as long as its match's continuation, the node budget for trees."""
    proposer = NgramProposer(ngram_min=1, ngram_max=3)
    rng = random.Random(3)
    for trial in range(200):
        token_ids = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        k = rng.randrange(1, 8)
        offered, kind = proposer.offer(memos(f"o{trial}"), token_ids, k, tree=False)
        assert kind == (f"n{brute_force_order(token_ids, 1, 3)}" if offered else "")
        drafted = chain(proposer, token_ids, offered, f"o{trial}") if offered else []
        assert len(drafted) == offered <= k
        assert offered == 0 or len(chain(proposer, token_ids, k, f"o{trial}")) >= offered
        if offered == 0:
            assert chain(proposer, token_ids, k, f"o{trial}") == []
    assert proposer.offer(memos("t"), [1, 2, 1], 5, tree=True) == (5, "n1")
    assert proposer.offer(memos("u"), [1, 2, 3], 5, tree=True) == (0, "")
    assert proposer.offer(memos("v"), [7, 1, 2, 3, 9, 1, 2, 3], 2, tree=False) == (2, "n3")


def brute_force_order(token_ids: list[int], n_min: int, n_max: int) -> int:
    """The longest n whose suffix occurred earlier (0: none)."""
    num_tokens = len(token_ids)
    for n in range(min(n_max, num_tokens), n_min - 1, -1):
        suffix = token_ids[num_tokens - n :]
        if any(token_ids[e - n : e] == suffix for e in range(n, num_tokens)):
            return n
    return 0


def native_or_skip(n_min: int, n_max: int) -> NativeNgramIndex:
    index = native_ngram_index(n_min, n_max)
    if index is None:
        pytest.skip("the native CPU extension is not available")
    return index


# The Python index and its native twin (kernels/cpu/ngram_index.py), which the proposer uses
# where the extension loads.
INDEXES = {"python": NgramIndex, "native": native_or_skip}


@pytest.mark.parametrize("kind", INDEXES)
def test_incremental_index_equals_brute_force_rescan(kind):
    rng = random.Random(0)
    for trial in range(150):
        n_min = rng.randint(1, 3)
        n_max = rng.randint(n_min, 5)
        vocab = rng.randint(2, 6)
        index = INDEXES[kind](n_min, n_max)
        token_ids: list[int] = []
        for _ in range(rng.randint(1, 12)):
            token_ids += [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
            index.sync(token_ids)
            k, limit = rng.randint(1, 6), rng.randint(1, 5)
            expected = brute_force_ends(token_ids, n_min, n_max, k, limit)
            assert index.candidate_ends(k, limit) == expected, (trial, token_ids, k, limit)


def test_chains_and_trees_follow_the_index_candidates():
    rng = random.Random(1)
    proposer = NgramProposer(ngram_min=1, ngram_max=3, max_tree_candidates=4)
    token_ids: list[int] = []
    for step in range(60):
        token_ids += [rng.randrange(4) for _ in range(rng.randint(1, 3))]
        k = rng.randint(1, 6)
        ends = brute_force_ends(token_ids, 1, 3, k, 4)
        drafts = proposer.propose(
            [
                ask("c", token_ids, k, tree=False),
                ask("t", token_ids, k, tree=True),
            ]
        )
        expected_chain = token_ids[ends[0] : ends[0] + k] if ends else []
        assert drafts.chains.get("c", []) == expected_chain, step
        expected_tree = trie_of([token_ids[e : e + k] for e in ends], k)
        assert drafts.num_draft_tokens("t") == expected_tree.num_nodes
        if expected_tree.num_nodes:
            assert drafts.trees["t"] == expected_tree


def test_sync_indexes_only_new_tokens(monkeypatch):
    index = NgramIndex(1, 3)
    appended: list[int] = []
    original = NgramIndex._append
    monkeypatch.setattr(
        NgramIndex, "_append", lambda self, t: (appended.append(t), original(self, t))
    )
    index.sync([1, 2, 3])
    index.sync([1, 2, 3, 4, 5])
    assert appended == [1, 2, 3, 4, 5]
    index.sync([9, 9])  # shrank: cannot happen for verified tokens, but rebuild rather than lie
    assert index.token_ids == [9, 9] and index.candidate_ends(1, 1) == [1]


def paths(tree) -> list[tuple[int, ...]]:
    """Every node's token path from the root's first child down to it."""
    result: list[tuple[int, ...]] = []
    for i, parent in enumerate(tree.parent_ids):
        result.append((result[parent] if parent is not None else ()) + (tree.token_ids[i],))
    return result


def assert_valid_tree(tree, budget: int) -> None:
    assert tree.num_nodes <= budget
    siblings = [(p, t) for p, t in zip(tree.parent_ids, tree.token_ids, strict=True)]
    assert len(set(siblings)) == len(siblings), "two siblings share a token"
    assert all(p is None or p < i for i, p in enumerate(tree.parent_ids))


def test_tree_merges_shared_prefixes_within_budget():
    # After suffix (1, 2): earlier occurrences continue 5 6 7 and 5 6 8 and 9.
    token_ids = [1, 2, 5, 6, 8, 0, 1, 2, 9, 0, 1, 2, 5, 6, 7, 0, 1, 2]
    proposer = NgramProposer(ngram_min=2, ngram_max=2)
    tree = proposer.propose([ask("r", token_ids, 16, tree=True)]).trees["r"]
    assert_valid_tree(tree, 16)
    node_paths = set(paths(tree))
    assert {(5, 6, 7), (5, 6, 8), (9,)} <= node_paths
    assert sum(1 for p in tree.parent_ids if p is None) == 2  # 5 and 9 share the root
    for budget in (1, 2, 3, 5):
        small = proposer.propose([ask("r", token_ids, budget, tree=True)]).trees["r"]
        assert_valid_tree(small, budget)
        assert small.num_nodes == budget
        assert small.token_ids[0] == 5  # the best candidate's first token is always kept


@pytest.mark.parametrize("budget", [1, 4, 7, 16])
def test_trie_of_budget_split(budget):
    best, second = [1] * 20, [2] * 20
    tree = trie_of([best, second], budget)
    assert_valid_tree(tree, budget)
    assert tree.num_nodes == budget
    depth_of = dict(zip(tree.token_ids, tree.depths(), strict=False))
    assert depth_of[1] >= 1
    if budget >= 2:
        assert 2 in tree.token_ids  # the second candidate gets at least one node
        assert tree.token_ids.count(1) >= tree.token_ids.count(2)
    assert trie_of([best], budget).depths() == list(range(1, budget + 1))


def test_the_index_lives_in_the_requests_memos():
    proposer = NgramProposer()
    assert chain(proposer, [1, 2, 1, 2, 1], 2, "x") == [2, 1]
    assert isinstance(memos("x")["ngram"], (NgramIndex, NativeNgramIndex))
    assert not request_state_in(proposer, lambda key: key == "x")


@pytest.mark.parametrize("kind", INDEXES)
def test_best_match_is_the_first_candidate_end_and_the_longest_match(kind):
    """The offer's one-pass lookup agrees with candidate_ends and with the longest suffix
    n-gram found earlier by a rescan, on random token streams (few symbols, so matches of
    every order occur)."""
    rng = random.Random(7)
    for _ in range(200):
        n_min, n_max = rng.randint(1, 2), rng.randint(2, 5)
        index = INDEXES[kind](n_min, n_max)
        tokens = [rng.randint(0, 4) for _ in range(rng.randint(1, 40))]
        index.sync(tokens)
        k = rng.randint(1, 6)
        ends = index.candidate_ends(k, 1)
        orders = [
            n
            for n in range(n_min, min(n_max, len(tokens)) + 1)
            if any(tokens[e - n : e] == tokens[-n:] for e in range(n, len(tokens)))
        ]
        want = (ends[0], max(orders)) if ends else (0, 0)
        assert index.best_match(k) == want


def test_a_shadow_chain_is_the_proposed_chain_with_the_offers_kind():
    """shadow_chain (what a shadow check asks) is propose()'s chain and offer()'s kind, on
    random streams where matches of every order occur and some requests have none."""
    rng = random.Random(11)
    proposer = NgramProposer(1, 4)
    for trial in range(200):
        tokens = [rng.randrange(rng.choice([3, 40])) for _ in range(rng.randint(1, 60))]
        k = rng.randint(1, 8)
        count, kind = proposer.offer(memos(f"o{trial}"), tokens, k, False)
        want = chain(proposer, tokens, k, f"p{trial}")
        got = proposer.shadow_chain(memos(f"s{trial}"), tokens, k)
        assert got == (want, kind) and len(want) == count, (tokens, k)
