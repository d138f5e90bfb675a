"""Drafts of about break-even gain do not run: a plan's drafts must beat the plan without them
by goodput.DRAFT_MARGIN, in the search and in the best responses between searches."""

from __future__ import annotations

import pytest

from engine.speculation.control import goodput
from engine.speculation.control.search import (
    Prices,
    SearchProblem,
    SearchSlot,
    best_lengths,
    best_response,
)
from tests.engine.speculation.control.test_goodput import LinearCost, decode_base

COST = LinearCost(0.01, 1e-3)  # one decode 11 ms, each draft 1 ms more
BREAK_EVEN = 1e-3 / 0.011  # the acceptance at which one draft neither gains nor loses


def one_request(a: float) -> SearchProblem:
    return SearchProblem([SearchSlot([a], range(1, 2), 1)], decode_base(1), COST)


@pytest.mark.parametrize("gain", [1.005, 1.02])
def test_a_draft_within_the_margin_does_not_run(gain):
    a = gain * (1.0 + BREAK_EVEN) - 1.0  # predicted goodput with the draft: gain x without
    problem = one_request(a)
    found = best_lengths(problem)
    assert found.ks == (1,), "the search alone takes any gain"
    assert goodput._worth_drafting(problem, found).ks == (0,)


def test_a_draft_past_the_margin_runs():
    problem = one_request(0.3)  # about 1.2x the goodput without it
    assert goodput._worth_drafting(problem, best_lengths(problem)).ks == (1,)


def test_a_forced_probe_stays_whatever_the_margin():
    problem = SearchProblem([SearchSlot([0.001], range(1, 2), 1, floor=1)], decode_base(1), COST)
    assert goodput._worth_drafting(problem, best_lengths(problem)).ks == (1,)


def test_best_responses_price_drafts_at_the_margin():
    prices = Prices(level=100.0, per_token=1e-3, per_request=0.0)  # drafts pay from a = 0.1
    assert best_response([0.101], 1, 0, prices) == 1
    assert best_response([0.101], 1, 0, prices, margin=0.03) == 0
    assert best_response([0.2], 1, 0, prices, margin=0.03) == 1
    assert best_response([0.001], 1, 1, prices, margin=0.03) == 1  # a floor holds
