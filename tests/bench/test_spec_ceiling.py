"""The chain-speculation ceiling's arithmetic (benchmarks/spec_ceiling.py)."""

import pytest

from benchmarks.spec_ceiling import best_chain, report


def test_free_drafts_and_free_rows_take_the_longest_chain():
    k, speedup = best_chain([1.0] * 9, 0.0, 1.0)
    assert (k, speedup) == (8, pytest.approx(9.0))


def test_the_best_chain_weighs_tokens_against_rows_and_passes():
    verify = [1.0, 1.2, 1.4, 2.0, 2.6]
    # a = 1, one pass 0.5: k = 1 -> 2 / 1.7, k = 2 -> 3 / 2.4, k = 3 -> 4 / 3.5, k = 4 -> 5 / 4.6
    k, speedup = best_chain(verify, 0.5, 1.0)
    assert k == 2 and speedup == pytest.approx(3 / 2.4)


def test_no_chain_pays_when_every_row_costs_a_step():
    verify = [1.0, 2.0, 3.0]
    assert best_chain(verify, 0.1, 0.9) == (0, 1.0)


def test_the_report_prints_each_acceptance_with_the_best_chain_of_each_proposer():
    text = report([1.0, 1.2, 1.4, 2.0], 0.4, 0.02)
    assert "one-row step 20.0 ms; a draft pass 0.400 of it" in text
    row = next(line for line in text.splitlines() if line.startswith("| 1.00 |"))
    assert row == "| 1.00 | 2, 2.14x | 2, 1.36x | 3, 1.82x |"
