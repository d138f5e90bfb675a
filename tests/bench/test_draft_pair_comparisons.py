"""draft_pair.py's comparison of `auto` with each single proposer: a rate ratio per workload with
an interval from resampling whole prompts, paired."""

from __future__ import annotations

import random

import pytest

from benchmarks.draft_pair import comparisons
from benchmarks.report import bootstrap_interval


def run(config: str, prompt: int, seconds: float, workload: str = "code_edit") -> dict:
    return dict(
        workload=workload, config=config, prompt=prompt, decode_tokens=63, decode_seconds=seconds
    )


def rows_of(runs: list[dict]) -> list[dict]:
    """summarize()'s fields that comparisons() reads: tok/s per (workload, config)."""
    totals: dict = {}
    for r in runs:
        tokens, seconds = totals.get((r["workload"], r["config"]), (0, 0.0))
        totals[(r["workload"], r["config"])] = (
            tokens + r["decode_tokens"],
            seconds + r["decode_seconds"],
        )
    return [dict(workload=w, config=c, tok_s=t / s) for (w, c), (t, s) in totals.items()]


def test_pairing_cancels_the_drift_between_prompts():
    """Prompts whose speeds differ fivefold, auto 5% faster on each: the ratio and its whole
    interval are 1.05. Resampling the two configs' prompts apart would widen it."""
    rng, runs = random.Random(0), []
    for prompt in range(8):
        seconds = rng.uniform(1.0, 5.0)
        runs += [run("ngram@goodput", prompt, seconds), run("auto:chain:4", prompt, seconds / 1.05)]
    [found] = comparisons(runs, rows_of(runs))
    assert (found["config"], found["versus"], found["best"]) == (
        "auto:chain:4",
        "ngram@goodput",
        True,
    )
    assert found["ratio"] == pytest.approx(1.05)
    assert found["interval"] == pytest.approx((1.05, 1.05))


def test_each_single_is_compared_and_the_fastest_is_marked_best():
    runs = []
    for prompt in range(4):
        runs += [run("off", prompt, 4.0), run("ngram@goodput", prompt, 2.0)]
        runs += [run("draft:chain:4@goodput", prompt, 3.0), run("auto:chain:4", prompt, 2.2)]
    found = {c["versus"]: c for c in comparisons(runs, rows_of(runs))}
    assert set(found) == {"ngram@goodput", "draft:chain:4@goodput"}  # never off
    assert found["ngram@goodput"]["best"] and not found["draft:chain:4@goodput"]["best"]
    assert found["ngram@goodput"]["ratio"] == pytest.approx(2.0 / 2.2)
    assert found["draft:chain:4@goodput"]["ratio"] == pytest.approx(3.0 / 2.2)


def test_noisy_prompts_give_an_interval_around_the_ratio_and_one_prompt_none():
    rng, runs = random.Random(2), []
    for prompt in range(10):
        runs += [
            run("ngram@goodput", prompt, 2.0),
            run("auto:chain:4", prompt, rng.uniform(1.6, 2.4)),
        ]
    [found] = comparisons(runs, rows_of(runs))
    low, high = found["interval"]
    assert low < found["ratio"] < high and high - low > 0.02
    assert comparisons(runs[:2], rows_of(runs[:2]))[0]["interval"] is None


def test_bootstrap_interval_skips_resamples_without_a_statistic():
    items = [0, 0, 1]
    interval = bootstrap_interval(items, lambda drawn: sum(drawn) or None, resamples=200)
    assert interval is not None and interval[0] >= 1
    assert bootstrap_interval([0, 0], lambda drawn: None) is None
