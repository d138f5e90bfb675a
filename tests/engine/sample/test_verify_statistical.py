"""Statistical losslessness: speculative output is distributed exactly as sampling from p.

Set-up: a fixed Markov "target" P[prev] over V = 8 tokens and a different Markov "draft" Q.
NUM_TRIALS requests, each with its own seed, start from ROOT; every step proposes drafts for
each of them (chains or trees from Q: deterministic, or sampled by inverse CDF at the target's
own uniform as the draft-model proposer does), lays out their rows and target logits
log P[row input] as the model runner would, and runs the engine's BatchVerifier over the whole
batch. Steps repeat until every trial has SEQ_LEN tokens; the joint law of those tokens is
compared with P[root, t1] * P[t1, t2] * P[t2, t3] by a chi-square goodness-of-fit test (cells
with expected count < 5 pooled). Lossless runs must give p-value > ALPHA; the planted bugs
(uniforms shared across positions, a first draft always accepted, the draft emitted at a
mismatch) must give p-value < BUG_ALPHA, which shows the check can fail.
"""

from __future__ import annotations

import math

import pytest
import torch

import engine.sample.batch_verify as batch_verify
from engine.outputs import DraftTree, ScheduledRequest
from engine.request import Request
from engine.runner.input_batch import RequestRows
from engine.sample.rng import uniforms
from engine.sample.sampler import Sampler
from engine.sample.verify import VerifyResult, verify_chain
from engine.sampling_params import SamplingParams
from kernels.sampling import inverse_cdf, sample_from_probs
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


def joint_probs() -> torch.Tensor:
    probs = TARGET[ROOT]
    for _ in range(SEQ_LEN - 1):
        last = torch.arange(probs.numel()) % VOCAB
        probs = (probs[:, None] * TARGET[last]).flatten()
    return probs


def draft_chain(request: Request, k: int, sampled: bool) -> list[int]:
    """k drafts from Q: its argmax chain, or inverse CDF at the target's uniforms."""
    chain, current = [], request.all_token_ids[-1]
    for j in range(k):
        q = DRAFT[current]
        if sampled:
            u = torch.from_numpy(uniforms([request.seed], [request.num_tokens + j]))
            current = int(inverse_cdf(q[None], u)[0])
        else:
            current = int(q.argmax())
        chain.append(current)
    return chain


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


def pvalue_of(propose, seed_base: int = 0) -> float:
    requests = [Request(f"t{i}", [ROOT], PARAMS, seed=seed_base + i) for i in range(NUM_TRIALS)]
    while pending := [r for r in requests if r.num_output_tokens < SEQ_LEN]:
        step(pending, propose)
    codes = torch.tensor(
        [math.fsum(t * VOCAB**j for j, t in enumerate(reversed(r.output_token_ids[:SEQ_LEN])))
         for r in requests], dtype=torch.long,
    )  # fmt: skip
    counts = torch.bincount(codes, minlength=VOCAB**SEQ_LEN)
    return chi_square_pvalue(counts, joint_probs())


PROPOSERS = {
    "plain": lambda r: [],
    "chain-deterministic": lambda r: draft_chain(r, 2, sampled=False),
    "chain-draft-model": lambda r: draft_chain(r, 2, sampled=True),
    "tree-deterministic": lambda r: draft_tree(r, duplicate=False),
    "tree-duplicate-siblings": lambda r: draft_tree(r, duplicate=True),
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


def test_sampler_kernel_matches_probs():
    probs = TARGET[ROOT].expand(NUM_TRIALS, VOCAB).contiguous()
    u = torch.from_numpy(uniforms(range(NUM_TRIALS), [0] * NUM_TRIALS))
    tokens = sample_from_probs(probs, u)
    assert chi_square_pvalue(torch.bincount(tokens, minlength=VOCAB), TARGET[ROOT]) > ALPHA


def test_check_rejects_uniforms_shared_across_positions(monkeypatch):
    monkeypatch.setattr(
        batch_verify, "uniforms", lambda seeds, positions: uniforms(seeds, [0] * len(seeds))
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
