"""Statistical losslessness: speculative output is distributed exactly as sampling from p.

Set-up: a fixed Markov "target" P[prev] over V = 8 tokens and a different Markov "draft" Q.
NUM_TRIALS requests, each with its own seed, start from ROOT; every step proposes drafts for
each of them (chains or trees from Q: deterministic, or raced with the target's own noise as
the draft-model proposer does: chains of race winners, trees of first finishers), lays out their rows and target logits
log P[row input] as the model runner would, and runs the engine's BatchVerifier over the whole
batch. Steps repeat until every trial has SEQ_LEN tokens; the joint law of those tokens is
compared with P[root, t1] * P[t1, t2] * P[t2, t3] by a chi-square goodness-of-fit test (cells
with expected count < 5 pooled), also with top-p and with a grammar mask applied to the target
(the law is then the filtered P's). Lossless runs must give p-value > ALPHA; the planted bugs
(race keys shared across positions, a first draft always accepted, the draft emitted at a
mismatch) must give p-value < BUG_ALPHA, which shows the check can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import engine.sample.batch_verify as batch_verify
from engine.outputs import DraftTree, ScheduledRequest
from engine.request import Request
from engine.runner.input_batch import RequestRows
from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler
from engine.sample.verify import VerifyResult, verify_chain
from engine.sampling_params import SamplingParams
from kernels.sampling import filter_probs, race_topk, sample_from_probs
from tests.stats import chi_square_pvalue

VOCAB = 8
ROOT = 3
SEQ_LEN = 3
NUM_TRIALS = 20_000
ALPHA = 1e-3  # a correct verifier fails at this rate per test (fixed seeds make it repeatable)
BUG_ALPHA = 1e-9
PARAMS = SamplingParams(temperature=1.0, max_tokens=SEQ_LEN + 8)
TREE_PARENTS = (None, None, 0, 1, 2)  # two root children, each with a child; node 2 has one


def markov(seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(VOCAB, VOCAB, generator=generator), dim=-1)


TARGET, DRAFT = markov(0), markov(1)


TOP_P = SamplingParams(temperature=1.0, top_p=0.7, max_tokens=SEQ_LEN + 8)
FORBIDDEN = (1, 6)  # the fake grammar's banned tokens


def law(params: SamplingParams = PARAMS, grammar: bool = False) -> torch.Tensor:
    """The target's next-token law [VOCAB, VOCAB] after its filters (top-p, a grammar)."""
    target = TARGET.clone()
    if grammar:
        target[:, list(FORBIDDEN)] = 0.0
        target /= target.sum(dim=-1, keepdim=True)
    if params.top_p < 1:
        target = filter_probs(target, top_p=torch.full((VOCAB,), params.top_p))
    return target


def joint_probs(target: torch.Tensor = TARGET) -> torch.Tensor:
    probs = target[ROOT]
    for _ in range(SEQ_LEN - 1):
        last = torch.arange(probs.numel()) % VOCAB
        probs = (probs[:, None] * target[last]).flatten()
    return probs


def key(request: Request, depth: int) -> torch.Tensor:
    """The race key of the token `depth` positions past the request's next one."""
    return torch.from_numpy(race_keys([request.seed], [request.num_tokens + depth]))


def draft_chain(request: Request, k: int, sampled: bool) -> list[int]:
    """k drafts from Q: its argmax chain, or the winners of Q's races run with the target's
    own noise (the draft-model proposer's coupling)."""
    chain, current = [], request.all_token_ids[-1]
    for j in range(k):
        q = DRAFT[current]
        current = (
            int(sample_from_probs(q[None], key(request, j))[0]) if sampled else int(q.argmax())
        )
        chain.append(current)
    return chain


def raced_tree(request: Request) -> DraftTree:
    """Root children: the first two finishers of Q's race at the next position (Gumbel-top-2);
    each deeper node: the winner of Q's race at its position."""
    first, second = race_topk(DRAFT[request.all_token_ids[-1]][None], key(request, 0), 2)[0]
    tokens = [int(first), int(second)]
    depths = [1, 1]
    for parent in TREE_PARENTS[2:]:
        q = DRAFT[tokens[parent]][None]
        tokens.append(int(sample_from_probs(q, key(request, depths[parent]))[0]))
        depths.append(depths[parent] + 1)
    return DraftTree(tuple(tokens), TREE_PARENTS)


def draft_tree(request: Request, duplicate: bool) -> DraftTree:
    """Root children: Q's best two (or the best twice); deeper nodes: Q's argmax."""
    top2 = DRAFT[request.all_token_ids[-1]].topk(2).indices.tolist()
    tokens: list[int] = []
    for node, parent in enumerate(TREE_PARENTS):
        if parent is None:
            tokens.append(top2[0 if duplicate else node])
        else:
            tokens.append(int(DRAFT[tokens[parent]].argmax()))
    return DraftTree(tuple(tokens), TREE_PARENTS)


def step(requests: list[Request], propose) -> None:
    """One engine-shaped verify step for every unfinished trial; appends the emitted tokens."""
    batch, contexts, first = [], [], 0
    for request in requests:
        drafts = propose(request)
        tree = drafts if isinstance(drafts, DraftTree) else None
        draft_ids = tree.token_ids if tree else tuple(drafts)
        count = 1 + len(draft_ids)
        scheduled = ScheduledRequest(request, count, count - 1, request.num_tokens - 1)
        rows = tuple(range(first, first + count))
        batch.append(RequestRows(scheduled, draft_ids, tree, request.num_tokens - 1, 1, rows, ()))
        contexts += [request.all_token_ids[-1], *draft_ids]
        first += count
    logits = TARGET[torch.tensor(contexts)].log()
    done = batch_verify.BatchVerifier(Sampler()).verify(batch, logits)
    for request in requests:
        request.output_token_ids.extend(done[request.request_id].token_ids)


class FakeGrammar:
    """Bans FORBIDDEN at every position (the matcher's interface as batch_verify reads it)."""

    num_words = 1

    def masks(self, draft_ids) -> np.ndarray:
        allowed = sum(1 << t for t in range(VOCAB) if t not in FORBIDDEN)
        return np.full((len(draft_ids) + 1, 1), allowed, dtype=np.int32)


def pvalue_of(
    propose, seed_base: int = 0, params: SamplingParams = PARAMS, grammar: bool = False
) -> float:
    requests = [Request(f"t{i}", [ROOT], params, seed=seed_base + i) for i in range(NUM_TRIALS)]
    for request in requests:
        request.grammar = FakeGrammar() if grammar else None
    while pending := [r for r in requests if r.num_output_tokens < SEQ_LEN]:
        step(pending, propose)
    codes = torch.tensor(
        [math.fsum(t * VOCAB**j for j, t in enumerate(reversed(r.output_token_ids[:SEQ_LEN])))
         for r in requests], dtype=torch.long,
    )  # fmt: skip
    counts = torch.bincount(codes, minlength=VOCAB**SEQ_LEN)
    return chi_square_pvalue(counts, joint_probs(law(params, grammar)))


PROPOSERS = {
    "plain": lambda r: [],
    "chain-deterministic": lambda r: draft_chain(r, 2, sampled=False),
    "chain-draft-model": lambda r: draft_chain(r, 2, sampled=True),
    "tree-deterministic": lambda r: draft_tree(r, duplicate=False),
    "tree-duplicate-siblings": lambda r: draft_tree(r, duplicate=True),
    "tree-draft-model": raced_tree,
}


def test_joint_probs_is_a_distribution():
    probs = joint_probs()
    assert probs.shape == (VOCAB**SEQ_LEN,)
    assert probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    t1, t2, t3 = 5, 0, 7
    expected = TARGET[ROOT, t1] * TARGET[t1, t2] * TARGET[t2, t3]
    assert probs[(t1 * VOCAB + t2) * VOCAB + t3].item() == pytest.approx(expected.item())


@pytest.mark.parametrize("name", list(PROPOSERS))
def test_speculative_output_matches_target(name):
    pvalue = pvalue_of(PROPOSERS[name])
    assert pvalue > ALPHA, f"{name}: p-value {pvalue:.3g}"


@pytest.mark.parametrize("name", ["chain-draft-model", "tree-draft-model"])
def test_speculative_output_matches_the_top_p_target(name):
    pvalue = pvalue_of(PROPOSERS[name], seed_base=10**6, params=TOP_P)
    assert pvalue > ALPHA, f"{name}: p-value {pvalue:.3g}"


def test_speculative_output_matches_the_grammar_masked_target():
    """Chains only: grammar requests never get trees."""
    pvalue = pvalue_of(PROPOSERS["chain-draft-model"], seed_base=2 * 10**6, grammar=True)
    assert pvalue > ALPHA, f"p-value {pvalue:.3g}"


def test_sampler_kernel_matches_probs():
    probs = TARGET[ROOT].expand(NUM_TRIALS, VOCAB).contiguous()
    keys = torch.from_numpy(race_keys(range(NUM_TRIALS), [0] * NUM_TRIALS))
    tokens = sample_from_probs(probs, keys)
    assert chi_square_pvalue(torch.bincount(tokens, minlength=VOCAB), TARGET[ROOT]) > ALPHA


def test_check_rejects_race_keys_shared_across_positions(monkeypatch):
    monkeypatch.setattr(
        batch_verify, "race_keys", lambda seeds, positions: race_keys(seeds, [0] * len(seeds))
    )
    assert pvalue_of(PROPOSERS["chain-deterministic"]) < BUG_ALPHA


def test_check_rejects_a_first_draft_always_accepted(monkeypatch):
    def accept_first(targets, drafts):
        if not drafts:
            return verify_chain(targets, drafts)
        rest = verify_chain(targets[1:], drafts[1:])
        return VerifyResult(
            (drafts[0], *rest.token_ids), (0, *(1 + n for n in rest.accepted_node_ids))
        )

    monkeypatch.setattr(batch_verify, "verify_chain", accept_first)
    assert pvalue_of(PROPOSERS["chain-draft-model"]) < BUG_ALPHA


def test_check_rejects_the_draft_emitted_at_a_mismatch(monkeypatch):
    def emit_draft(targets, drafts):
        result = verify_chain(targets, drafts)
        if result.num_accepted < len(drafts):
            tokens = (*result.token_ids[:-1], drafts[result.num_accepted])
            return VerifyResult(tokens, result.accepted_node_ids)
        return result

    monkeypatch.setattr(batch_verify, "verify_chain", emit_draft)
    assert pvalue_of(PROPOSERS["chain-deterministic"]) < BUG_ALPHA
