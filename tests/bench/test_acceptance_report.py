"""acceptance_report.py's interval of realised / expected acceptance, from prompts resampled."""

from __future__ import annotations

import random

import pytest

from benchmarks.acceptance_report import ratio_interval


def trials(prompt: int, accepted: int, total: int, expected: float) -> list[dict]:
    return [
        {"prompt": prompt, "accepted": i < accepted, "one_minus_tv": expected} for i in range(total)
    ]


def test_one_prompt_gives_no_interval():
    assert ratio_interval(trials(0, 3, 10, 0.5), "one_minus_tv") is None


def test_prompts_alike_give_their_ratio():
    records = [r for p in range(5) for r in trials(p, 6, 10, 0.75)]
    low, high = ratio_interval(records, "one_minus_tv")
    assert low == pytest.approx(0.8) and high == pytest.approx(0.8)


def test_the_interval_holds_the_pooled_ratio_within_the_prompts_own():
    rng = random.Random(1)
    records, ratios = [], []
    for p in range(12):
        total, expected = rng.randint(5, 40), rng.uniform(0.4, 0.9)
        accepted = rng.randint(0, total)
        records += trials(p, accepted, total, expected)
        ratios.append(accepted / (total * expected))
    pooled = sum(r["accepted"] for r in records) / sum(r["one_minus_tv"] for r in records)
    low, high = ratio_interval(records, "one_minus_tv")
    assert min(ratios) <= low < pooled < high <= max(ratios)


def test_a_prompt_weighs_by_its_trials():
    # one long prompt all accepted, five short ones none: a resample drawing the long prompt
    # even once sits above 0.9 when trials weigh (about the share of long draws, ~0.5 at the
    # 95th percentile, if prompts weighed alike)
    records = trials(0, 100, 100, 1.0) + [r for p in range(1, 6) for r in trials(p, 0, 2, 1.0)]
    low, high = ratio_interval(records, "one_minus_tv")
    assert low == 0.0 and high > 0.9
    assert ratio_interval(records, "one_minus_tv", seed=3) == ratio_interval(
        records, "one_minus_tv", seed=3
    )
