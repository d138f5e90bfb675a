"""draft_pair.py's comparison of `auto` with each single proposer: a rate ratio per workload with
an interval from resampling whole prompts, paired."""

from __future__ import annotations

import random

import pytest

from benchmarks.draft_pair import comparisons, config_rates, pooled
from benchmarks.report import bootstrap_interval


def run(config: str, prompt: int, seconds: float, workload: str = "code_edit") -> dict:
    return dict(
        workload=workload, config=config, prompt=prompt, decode_tokens=63, decode_seconds=seconds
    )


def test_pairing_cancels_the_drift_between_prompts():
    """Prompts whose speeds differ fivefold, auto 5% faster on each: the ratio and its whole
    interval are 1.05. Resampling the two configs' prompts apart would widen it."""
    rng, runs = random.Random(0), []
    for prompt in range(8):
        seconds = rng.uniform(1.0, 5.0)
        runs += [run("ngram@goodput", prompt, seconds), run("auto:chain:4", prompt, seconds / 1.05)]
    [found] = comparisons(runs, config_rates(runs))
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
    found = {c["versus"]: c for c in comparisons(runs, config_rates(runs))}
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
    [found] = comparisons(runs, config_rates(runs))
    low, high = found["interval"]
    assert low < found["ratio"] < high and high - low > 0.02
    assert comparisons(runs[:2], config_rates(runs[:2]))[0]["interval"] is None


def test_bootstrap_interval_skips_resamples_without_a_statistic():
    items = [0, 0, 1]
    interval = bootstrap_interval(items, lambda drawn: sum(drawn) or None, resamples=200)
    assert interval is not None and interval[0] >= 1
    assert bootstrap_interval([0, 0], lambda drawn: None) is None


def test_pooled_repeats_sum_per_prompt_and_keep_workloads_apart():
    """Two repeats of one command: each (workload, config, prompt) becomes one run with the
    repeats' tokens and seconds summed; the same prompt index of another workload stays apart."""
    first = [run("auto:chain:4", 0, 2.0), run("auto:chain:4", 0, 5.0, workload="chat")]
    second = [run("auto:chain:4", 0, 3.0), run("auto:chain:4", 0, 7.0, workload="chat")]
    merged = {(r["workload"], r["prompt"]): r for r in pooled([first, second])}
    assert set(merged) == {("code_edit", 0), ("chat", 0)}
    assert merged[("code_edit", 0)]["decode_seconds"] == pytest.approx(5.0)
    assert merged[("chat", 0)]["decode_seconds"] == pytest.approx(12.0)
    assert merged[("code_edit", 0)]["decode_tokens"] == 126


def test_repeats_average_a_prompts_noise_and_narrow_the_interval():
    """Each prompt's auto run is noisy around 5% faster than n-gram; pooling four repeats per
    prompt gives a narrower interval than one repeat, around the same ratio."""
    rng = random.Random(3)

    def repeat() -> list[dict]:
        runs = []
        for prompt in range(10):
            runs += [
                run("ngram@goodput", prompt, 2.0),
                run("auto:chain:4", prompt, 2.0 / 1.05 * rng.uniform(0.8, 1.2)),
            ]
        return runs

    one = repeat()
    [single] = comparisons(one, config_rates(one))
    runs = pooled([one, repeat(), repeat(), repeat()])
    [four] = comparisons(runs, config_rates(runs))
    width = lambda found: found["interval"][1] - found["interval"][0]  # noqa: E731
    assert width(four) < 0.7 * width(single)
    assert four["interval"][0] < 1.05 < four["interval"][1]
    assert config_rates(runs) == [
        dict(workload="code_edit", config=c, tok_s=pytest.approx(r))
        for c, r in (("ngram@goodput", 31.5), ("auto:chain:4", four["ratio"] * 31.5))
    ]
