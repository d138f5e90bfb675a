"""The Proposer protocol and registry, and both model-free proposers in a simulated engine loop."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import SpecConfig
from engine.speculation.build import make_proposer, proposer_names
from engine.speculation.proposers.ngram import NgramProposer
from engine.speculation.proposers.proposer import Proposer
from engine.speculation.proposers.recycle import RecycleProposer
from tests.engine.speculation.proposers.asks import ask, fresh_memos, observation  # noqa: F401

VOCAB = 50


def test_registry_builds_each_model_free_proposer():
    assert make_proposer(SpecConfig(proposer="none")) is None
    ngram = make_proposer(SpecConfig(proposer="ngram", ngram_min=2, ngram_max=3))
    assert isinstance(ngram, NgramProposer) and isinstance(ngram, Proposer)
    assert (ngram.ngram_min, ngram.ngram_max, ngram.name) == (2, 3, "ngram")
    recycle = make_proposer(SpecConfig(proposer="recycle"), vocab_size=VOCAB)
    assert isinstance(recycle, RecycleProposer) and isinstance(recycle, Proposer)
    assert recycle.adjacency.shape[0] == VOCAB


def test_registry_names_match_the_config_and_unknown_names_fail():
    from engine import config

    assert set(proposer_names()) == set(config._PROPOSERS)
    bad = SpecConfig(proposer="ngram")
    object.__setattr__(bad, "proposer", "magic")  # bypass validation to reach the registry
    with pytest.raises(ValueError, match="unknown speculative proposer 'magic'"):
        make_proposer(bad)
    with pytest.raises(ValueError, match="vocab_size"):
        make_proposer(dataclasses.replace(bad, proposer="recycle"))


def target_next(token_id: int) -> int:
    """A deterministic 'target model': a fixed permutation-like successor function."""
    return (token_id * 7 + 3) % VOCAB


def target_topk(token_id: int) -> tuple[int, ...]:
    best = target_next(token_id)
    return (best, (best + 1) % VOCAB, (best + 2) % VOCAB)


def verify_greedy(root_id: int, chain: list[int]) -> list[int]:
    """Accepted drafts + the correction/bonus token, as a greedy verifier would emit."""
    emitted, token_id = [], root_id
    for draft in chain:
        if draft != target_next(token_id):
            break
        emitted.append(draft)
        token_id = draft
    emitted.append(target_next(token_id))
    return emitted


@pytest.mark.parametrize("name", ["ngram", "recycle"])
def test_engine_loop_drafts_get_accepted_once_the_pattern_repeats(name):
    proposer = make_proposer(SpecConfig(proposer=name), vocab_size=VOCAB)
    token_ids = [0, 1, 2]
    num_accepted = num_proposed = 0
    for _ in range(40):
        root_id = token_ids[-1]
        drafts = proposer.propose([ask("r", list(token_ids), 4)])
        chain = drafts.chains.get("r", [])
        assert len(chain) <= 4 and drafts.proposer_time >= 0
        emitted = verify_greedy(root_id, chain)
        num_proposed += len(chain)
        num_accepted += len(emitted) - 1
        inputs = [root_id, *emitted[:-1]]  # the input token of each emitted token's logits row
        proposer.observe([observation("r", emitted, [target_topk(t) for t in inputs])])
        token_ids += emitted
    # The successor function cycles, so both the n-gram index and the adjacency learn it.
    assert num_proposed > 0 and num_accepted / num_proposed > 0.8
    assert len(token_ids) > 3 + 40 * 2  # more than one token per step on average


@pytest.mark.parametrize("name", ["ngram", "recycle"])
def test_batched_tree_proposals_respect_each_budget(name):
    proposer = make_proposer(SpecConfig(proposer=name), vocab_size=VOCAB)
    token_ids = [0]
    for _ in range(120):
        step = observation("warm", [target_next(token_ids[-1])], [target_topk(token_ids[-1])])
        proposer.observe([step])
        token_ids.append(target_next(token_ids[-1]))
    requests = [
        ask(f"r{budget}", token_ids[: 60 + budget], budget, tree=True) for budget in (1, 3, 8, 20)
    ]
    drafts = proposer.propose(requests)
    assert not drafts.chains
    for request in requests:
        tree = drafts.trees[request.request_id]
        assert 1 <= tree.num_nodes <= request.num_draft_tokens
        siblings = list(zip(tree.parent_ids, tree.token_ids, strict=True))
        assert len(set(siblings)) == len(siblings)
        first_child = tree.token_ids[tree.parent_ids.index(None)]
        assert first_child == target_next(request.token_ids[-1])  # best guess comes first
