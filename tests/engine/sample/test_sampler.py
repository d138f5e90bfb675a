"""Sampler: each logits transform on hand-made rows, batch invariance, seeding and logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler, SamplingRow
from engine.sampling_params import SamplingParams
from kernels.sampling import filter_probs, sample_from_probs

SAMPLER = Sampler()
LOGITS = torch.tensor([[2.0, 1.0, 0.5, -1.0, 3.0, 0.0]])


def row_of(params: dict, **fields) -> SamplingRow:
    return SamplingRow(SamplingParams(**params), **fields)


def probs_of(logits: torch.Tensor, **params) -> torch.Tensor:
    fields = {
        k: params.pop(k)
        for k in ("output_token_ids", "prompt_token_ids", "stop_ids_blocked")
        if k in params
    }
    return SAMPLER.process(logits, [row_of(params, **fields)])[0]


def test_greedy_is_a_point_mass_on_the_argmax_with_lowest_id_ties():
    probs = SAMPLER.process(
        torch.tensor([[1.0, 5.0, 5.0, 0.0], [0.0, 0.0, 0.0, 0.0]]),
        [row_of({"temperature": 0})] * 2,
    )
    assert torch.equal(probs, torch.tensor([[0.0, 1, 0, 0], [1, 0, 0, 0]]))


def test_plain_greedy_rows_take_the_one_reduction_fast_path_with_the_same_answer():
    """greedy_targets == process + sample + valid_rows for plain greedy rows: ties to the lowest
    id, NaN / inf / all -inf rows invalid; rows with edits or a grammar mask are not plain."""
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 50, generator=generator).round(decimals=1)  # ties occur
    logits[1, 7] = float("nan")
    logits[2, 3] = float("inf")
    logits[3] = float("-inf")
    logits[4, :10] = float("-inf")
    logits[5], logits[5, 9], logits[5, 4] = 0.0, 2.0, 2.0  # a tie: the lower id wins
    rows = [row_of({"temperature": 0})] * 8
    assert SAMPLER.plain_greedy(rows, None)
    probs = SAMPLER.process(logits, rows)
    targets, valid = SAMPLER.greedy_targets(logits)
    assert valid.tolist() == SAMPLER.valid_rows(logits, probs).tolist()
    assert valid.tolist() == [True, False, False, False, True, True, True, True]
    want = SAMPLER.sample(probs, None)
    assert torch.equal(targets[valid], want[valid]) and targets[5] == 4
    assert not SAMPLER.plain_greedy([row_of({"temperature": 0, "logit_bias": {1: 1.0}})], None)
    assert not SAMPLER.plain_greedy([row_of({"temperature": 0.7})], None)
    assert not SAMPLER.plain_greedy(rows[:1], torch.zeros(1, 2, dtype=torch.int32))


def test_targets_is_process_sample_and_valid_rows_or_the_greedy_fast_path():
    generator = torch.Generator().manual_seed(4)
    logits = torch.randn(4, 50, generator=generator)
    logits[2, 5] = float("nan")
    greedy = [row_of({"temperature": 0})] * 4
    fast = SAMPLER.targets(logits, greedy, None, None)
    assert all(torch.equal(a, b) for a, b in zip(fast, SAMPLER.greedy_targets(logits)))
    rows = [row_of({"temperature": 0.8, "seed": 1}), *greedy[:2], row_of({"top_k": 5})]
    keys = torch.from_numpy(race_keys([1, 0, 0, 2], [7, 7, 7, 7]))
    targets, valid = SAMPLER.targets(logits, rows, None, keys)
    probs = SAMPLER.process(logits, rows)
    assert torch.equal(targets, SAMPLER.sample(probs, keys))
    assert torch.equal(valid, SAMPLER.valid_rows(logits, probs))
    assert valid.tolist() == [True, True, False, True]


def test_temperature_scales_the_softmax():
    expected = torch.softmax(LOGITS[0] / 0.5, -1)
    assert torch.allclose(probs_of(LOGITS, temperature=0.5), expected)


def test_logit_bias_and_min_tokens():
    assert probs_of(LOGITS, temperature=0, logit_bias={1: 2.5})[1] == 1  # 1 + 2.5 > 3
    blocked = probs_of(
        LOGITS, temperature=1, min_tokens=2, output_token_ids=[0], stop_ids_blocked=(4, 0)
    )
    assert blocked[4] == 0 and blocked[0] == 0
    expected = torch.softmax(torch.tensor([1.0, 0.5, -1.0, 0.0]), -1)
    assert torch.allclose(blocked[[1, 2, 3, 5]], expected)
    reached = probs_of(
        LOGITS, temperature=0, min_tokens=2, output_token_ids=[0, 1], stop_ids_blocked=(4,)
    )
    assert reached[4] == 1


def test_repetition_penalty_covers_prompt_and_output():
    probs = probs_of(LOGITS, repetition_penalty=2.0, prompt_token_ids=[0], output_token_ids=[3, 3])
    adjusted = LOGITS[0].clone()
    adjusted[0] = 2.0 / 2  # positive: divided
    adjusted[3] = -1.0 * 2  # negative: multiplied (once, however often it appears)
    assert torch.allclose(probs, torch.softmax(adjusted, -1))


def test_presence_and_frequency_penalties_cover_output_only():
    probs = probs_of(
        LOGITS,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        prompt_token_ids=[1],
        output_token_ids=[4, 4, 2],
    )
    adjusted = LOGITS[0].clone()
    adjusted[4] -= 0.5 + 2 * 0.25
    adjusted[2] -= 0.5 + 1 * 0.25
    assert torch.allclose(probs, torch.softmax(adjusted, -1))


def test_filters_on_hand_made_probabilities():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])

    def keep(**kwargs) -> list[bool]:
        tensors = {k: torch.tensor([v]) for k, v in kwargs.items()}
        out = filter_probs(probs, **tensors)
        assert out.sum().item() == pytest.approx(1.0)
        return (out[0] > 0).tolist()

    assert keep(top_k=2) == [False, True, False, True]
    assert keep(top_k=0) == keep(top_k=-1) == [True] * 4
    assert keep(top_p=0.75) == [False, True, False, True]  # 0.5 < 0.75, 0.8 >= 0.75
    assert keep(top_p=0.85) == [False, True, True, True]
    assert keep(top_p=1.0) == [True] * 4
    assert keep(min_p=0.2) == [False, True, True, True]  # threshold 0.1
    # top-p after top-k renormalises: top-2 = {0.5, 0.3} -> {0.625, 0.375}; 0.625 >= 0.6.
    assert keep(top_k=2, top_p=0.6) == [False, True, False, False]
    assert torch.allclose(filter_probs(probs, top_k=torch.tensor([2]))[0, 1], torch.tensor(0.625))


def test_ties_at_a_cut_are_all_kept():
    probs = torch.tensor([[0.2, 0.4, 0.4], [0.1, 0.3, 0.6]])
    out = filter_probs(probs, top_k=torch.tensor([1, 0]), top_p=torch.tensor([1.0, 0.5]))
    assert torch.allclose(out, torch.tensor([[0.0, 0.5, 0.5], [0.0, 0.0, 1.0]]))


def test_mixed_batch_rows_use_their_own_params():
    params = [{"temperature": 0}, {"temperature": 1, "top_k": 1}, {"temperature": 2}]
    logits = LOGITS.repeat(3, 1)
    probs = SAMPLER.process(logits, [row_of(p) for p in params])
    assert probs[0].argmax() == 4 and probs[0].max() == 1
    assert probs[1].argmax() == 4 and probs[1].max() == 1
    assert torch.allclose(probs[2], torch.softmax(LOGITS[0] / 2, -1))
    with pytest.raises(ValueError, match="sampling rows"):
        SAMPLER.process(logits, [row_of({})])


def test_seeded_sampling_is_batch_invariant():
    """Same race key, same token, whatever the other rows of the batch are."""
    vocab = 1000
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(0))
    rows = [
        row_of({"temperature": 0.8, "top_p": 0.9}),
        row_of({"temperature": 1.2, "top_k": 50}),
        row_of({"temperature": 0}),
        row_of(
            {"temperature": 1.0, "min_p": 0.05, "repetition_penalty": 1.3}, output_token_ids=[1]
        ),
        row_of({"temperature": 0.7}),
    ]
    for seed in range(5):
        u = torch.from_numpy(race_keys([seed] * 5, range(5)))
        batched = SAMPLER.sample(SAMPLER.process(logits, rows), u).tolist()
        alone = [
            SAMPLER.sample(SAMPLER.process(logits[i : i + 1], [rows[i]]), u[i : i + 1]).item()
            for i in range(5)
        ]
        assert batched == alone
    draws = {
        SAMPLER.sample(
            SAMPLER.process(logits[4:], rows[4:]), torch.from_numpy(race_keys([s], [0]))
        ).item()
        for s in range(20)
    }
    assert len(draws) > 1  # the seed matters


def test_point_masses_win_every_race_and_none_means_argmax():
    probs = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]])
    for seed in range(20):
        keys = torch.from_numpy(race_keys([seed, seed], [0, 0]))
        tokens = sample_from_probs(probs, keys).tolist()
        assert tokens[0] == 1 and tokens[1] in (0, 2)  # a masked token never wins
    assert sample_from_probs(probs, None).tolist() == [1, 0]


def test_logprobs_from_raw_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    result = SAMPLER.logprobs(logits, [0, 2], [2, 0])
    expected = torch.log_softmax(logits, -1)
    assert result[0].token_id == 0
    assert result[0].logprob == pytest.approx(expected[0, 0].item())
    assert [t for t, _ in result[0].top] == [2, 1]
    assert result[0].top[0][1] == pytest.approx(expected[0, 2].item())
    assert result[1].logprob == pytest.approx(-math.log(4))
    assert result[1].top == ()


def reference_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Full-sort nucleus, ties at the cut kept: the definition the tiered kernel must match."""
    values = probs.double().sort(descending=True).values
    mass_before = values.cumsum(-1) - values
    threshold = values[(mass_before < top_p).sum() - 1]
    return (probs.double() >= threshold).float()


@pytest.mark.parametrize("scale", [0.1, 1.0, 4.0])  # flat rows need every candidate tier
def test_top_p_tiers_match_a_full_sort(scale):
    generator = torch.Generator().manual_seed(int(scale * 10))
    probs = torch.softmax(scale * torch.randn(4, 5000, generator=generator), -1)
    top_p = torch.tensor([0.3, 0.9, 0.97, 1.0])
    kept = filter_probs(probs, top_p=top_p) > 0
    for i, p in enumerate(top_p.tolist()):
        expected = reference_top_p(probs[i], p) > 0 if p < 1 else torch.ones(5000, dtype=bool)
        assert torch.equal(kept[i], expected)


def test_logprobs_of_no_rows():
    assert SAMPLER.logprobs(torch.zeros(0, 4), [], []) == []
