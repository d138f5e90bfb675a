"""Hand-built verification cases: chains and trees against given target tokens (verify.py),
and the batched pass that computes those targets from logits (batch_verify.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.outputs import DraftTree, ScheduledRequest
from engine.request import Request
from engine.runner.input_batch import RequestRows
from engine.sample.batch_verify import BatchVerifier
from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler
from engine.sample.verify import VerifyResult, verify_chain, verify_tree
from engine.sampling_params import SamplingParams
from kernels.sampling import sample_from_probs

# ---- chains ---------------------------------------------------------------------------


def test_greedy_chain_accepts_all_and_adds_bonus():
    result = verify_chain([4, 1, 5, 2], [4, 1, 5])
    assert result == VerifyResult((4, 1, 5, 2), (0, 1, 2))
    assert result.num_accepted == 3


def test_greedy_chain_rejects_first():
    assert verify_chain([3, 1, 5], [4, 1]) == VerifyResult((3,), ())


def test_greedy_chain_rejects_in_the_middle_and_ignores_later_matches():
    assert verify_chain([4, 0, 5, 2], [4, 1, 5]).token_ids == (4, 0)


def test_chain_without_drafts_emits_the_root_target_and_checks_rows():
    assert verify_chain([5], []).token_ids == (5,)
    with pytest.raises(ValueError, match="target rows"):
        verify_chain([1, 2], [1, 2])


# ---- trees ----------------------------------------------------------------------------
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
    result = verify_tree(TREE, target)
    assert result == VerifyResult((2, 4, 0, 5), (1, 3, 5))


def test_greedy_tree_equal_siblings_go_to_the_lower_index():
    target = [2, 3, 4, 5, 1, 3, 5]  # d's child f does not match (d -> 1); d and e tie at depth 2
    result = verify_tree(TREE, target)
    assert result == VerifyResult((2, 4, 1), (1, 3))


def test_greedy_tree_no_match_and_a_shallow_match():
    assert verify_tree(TREE, [5, 0, 0, 0, 0, 0, 0]) == VerifyResult((5,), ())
    # a matches but its child c does not: emit a, then the target's token after a.
    assert verify_tree(TREE, [1, 0, 0, 0, 0, 0, 0]) == VerifyResult((1, 0), (0,))


# ---- the batched pass ------------------------------------------------------------------------
V = 6


def rows_for(request: Request, drafts=(), tree=None, first_row=0) -> RequestRows:
    num_rows = 1 + (tree.num_nodes if tree else len(drafts))
    scheduled = ScheduledRequest(request, 1 + num_rows - 1, num_rows - 1, request.num_tokens - 1)
    draft_ids = tree.token_ids if tree else tuple(drafts)
    logit_rows = tuple(range(first_row, first_row + num_rows))
    return RequestRows(scheduled, draft_ids, tree, request.num_tokens - 1, 1, logit_rows, ())


def request(request_id: str, temperature: float, seed: int = 7) -> Request:
    params = SamplingParams(temperature=temperature, max_tokens=16)
    return Request(request_id, [1, 2, 3], params, seed=seed)


def logits_favouring(*token_ids: int) -> torch.Tensor:
    logits = torch.zeros(len(token_ids), V)
    logits[torch.arange(len(token_ids)), torch.tensor(token_ids)] = 5.0
    return logits


def test_batch_greedy_chain_tree_and_plain_rows_in_one_pass():
    tree = DraftTree(token_ids=(4, 2, 5), parent_ids=(None, None, 1))
    requests = [
        rows_for(request("plain", 0)),  # row 0
        rows_for(request("chain", 0), drafts=(3, 1), first_row=1),  # rows 1-3
        rows_for(request("tree", 0), tree=tree, first_row=4),  # rows 4-7
    ]
    # argmax per row: plain 2 | chain 3, 0, 4 | tree root 2, node0 1, node1 5, node2 0
    logits = logits_favouring(2, 3, 0, 4, 2, 1, 5, 0)
    done = BatchVerifier(Sampler()).verify(requests, logits, target_topk=2)
    assert done["plain"].token_ids == (2,) and done["plain"].path_rows == (0,)
    assert done["chain"].token_ids == (3, 0) and done["chain"].num_accepted_tokens == 1
    assert done["chain"].num_draft_tokens == 2 and done["chain"].path_rows == (1, 2)
    assert done["tree"].token_ids == (2, 5, 0) and done["tree"].accepted_node_ids == (1, 2)
    assert done["tree"].path_rows == (4, 6, 7)
    assert [ids[0] for ids in done["tree"].target_topk_ids] == [2, 5, 0]  # top-1 = greedy target


def test_batch_sampled_targets_use_the_race_of_the_predicted_position():
    torch.manual_seed(0)
    logits = torch.randn(3, V)
    req = request("s", 1.0, seed=11)  # 3 prompt tokens: rows predict positions 3, 4, 5
    done = BatchVerifier(Sampler()).verify([rows_for(req, drafts=(0, 0))], logits)
    probs = torch.softmax(logits, dim=-1)
    keys = torch.from_numpy(race_keys([11] * 3, [3, 4, 5]))
    expected = sample_from_probs(probs, keys).tolist()
    assert done["s"].token_ids == tuple(verify_chain(expected, [0, 0]).token_ids)


def test_batch_verify_skips_requests_without_sample_rows():
    req = request("prefill", 0)
    quiet = RequestRows(ScheduledRequest(req, 2, 0, 0), (), None, 0, 2, (), ())
    assert BatchVerifier(Sampler()).verify([quiet], torch.zeros(0, V)) == {}


def test_race_keys_depend_on_seed_and_position_only():
    a = race_keys([5, 5, 6], [10, 11, 10])
    assert a.shape == (3,) and a.dtype == np.int64
    assert len(set(a.tolist())) == 3
    assert (race_keys([5], [11]) == a[1:2]).all()
    assert (race_keys([5 + (1 << 63)], [10]) == a[:1]).all()  # seeds are taken mod 2**63


# ---- plain greedy decode rows: the fast path -----------------------------------------------
def _plain_rows(n: int, params: SamplingParams) -> list[RequestRows]:
    return [rows_for(Request(f"r{i}", [1, 2, 3], params, seed=i), first_row=i) for i in range(n)]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=16),  # the fast path
        SamplingParams(temperature=0, max_tokens=16, logit_bias={1: 3.0}),  # edits: general path
    ],
)
def test_plain_decode_rows_match_the_general_path(monkeypatch, params):
    import engine.sample.batch_verify as batch_verify

    logits = logits_favouring(2, 0, 5, 1, 1)
    rows = _plain_rows(5, params)
    fast = BatchVerifier(Sampler()).verify(rows, logits)
    monkeypatch.setattr(batch_verify, "plain_greedy", lambda request: False)
    general = BatchVerifier(Sampler()).verify(rows, logits)
    assert fast == general
    assert [fast[f"r{i}"].path_rows for i in range(5)] == [(i,) for i in range(5)]
    # logits_favouring gives the favoured token 5; a bias of 3 on token 1 does not beat it
    assert [fast[f"r{i}"].token_ids for i in range(5)] == [(2,), (0,), (5,), (1,), (1,)]


def test_plain_decode_rows_with_a_bad_row_fail_alone():
    logits = logits_favouring(2, 0, 5)
    logits[1, 3] = float("nan")
    done = BatchVerifier(Sampler()).verify(_plain_rows(3, SamplingParams(temperature=0)), logits)
    assert done["r1"].error is not None and done["r1"].token_ids == ()
    assert done["r0"].token_ids == (2,) and done["r2"].token_ids == (5,)
    assert done["r0"].error is None and done["r2"].error is None


@pytest.mark.parametrize(
    "params, num_output, plain",
    [
        (SamplingParams(temperature=0), 0, True),
        (SamplingParams(temperature=0.7), 0, False),
        (SamplingParams(temperature=0, logit_bias={4: 1.0}), 0, False),
        (SamplingParams(temperature=0, repetition_penalty=1.2), 0, False),
        (SamplingParams(temperature=0, presence_penalty=0.5), 0, False),
        (SamplingParams(temperature=0, min_tokens=3), 2, False),  # EOS still masked
        (SamplingParams(temperature=0, min_tokens=3), 3, True),
    ],
)
def test_plain_greedy_agrees_with_the_sampler_on_every_row(params, num_output, plain):
    from engine.sample.batch_verify import _histories, plain_greedy, sampling_row

    req = Request("p", [1, 2, 3], params, eos_token_ids=(0,))
    req.output_token_ids.extend([7] * num_output)
    rows = rows_for(req, drafts=(4, 5))
    sampler_rows = [sampling_row(req, history) for history in _histories(rows)]
    assert plain_greedy(req) is plain
    assert Sampler.plain_greedy(sampler_rows, None) is plain
