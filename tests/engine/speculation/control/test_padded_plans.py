"""The goodput search where verification replays padded CUDA graphs (padded_plans.py): a
plan's rows follow its longest chain, and the search finds brute force's best plan."""

from __future__ import annotations

import dataclasses
import itertools
import random

from engine.speculation.control.padded_plans import best_plan, plan_prices
from engine.speculation.control.search import (
    SearchProblem,
    SearchSlot,
    best_response,
    prices_at,
)
from engine.speculation.control.step_features import StepFeatures
from kernels.graph_shapes import GraphShapes

GRAPHS = GraphShapes((1, 2, 4, 8, 16), 5)  # chains of up to 4 drafts replayed, padded


class PaddedCost:
    """Step seconds from the rows the step computes (a replayed graph's padded rows), plus
    host costs per draft and per speculating request."""

    def __init__(self, intercept: float, per_row: float, per_draft: float, per_spec: float):
        self.intercept, self.per_row = intercept, per_row
        self.per_draft, self.per_spec = per_draft, per_spec
        self.num_observations = 0

    def predict(self, f: StepFeatures) -> float:
        rows = f.num_graph_rows or f.num_batched_tokens
        host = self.per_draft * f.num_draft_tokens + self.per_spec * f.num_spec_requests
        return self.intercept + self.per_row * rows + host


def problem_of(rates: list[float], cost, cap: int = 4, floors=None) -> SearchProblem:
    floors = floors or [0] * len(rates)
    slots = [
        SearchSlot([a**j for j in range(1, cap + 1)], range(1, cap + 1), cap, floor)
        for a, floor in zip(rates, floors)
    ]
    base = StepFeatures.from_shapes([(300, 1, 0)] * len(rates), graphs=GRAPHS)
    return SearchProblem(slots, base, cost, graphs=GRAPHS)


def brute_force(problem: SearchProblem, cap: int) -> float:
    ranges = [range(o[0].floor, cap + 1) for o in problem.options]
    return max(problem.evaluate(ks).goodput for ks in itertools.product(*ranges))


def random_cost(rng: random.Random) -> PaddedCost:
    return PaddedCost(
        rng.uniform(2e-3, 4e-3),
        rng.uniform(1e-6, 3e-5),
        rng.choice([0.0, rng.uniform(0, 2e-5)]),
        rng.choice([0.0, rng.uniform(0, 1e-4)]),
    )


def test_the_features_of_a_plan_pad_to_its_longest_chain():
    problem = problem_of([0.5] * 3, PaddedCost(1e-3, 1e-5, 0.0, 0.0))
    assert problem.pads
    f = problem.features([4, 0, 0])
    assert (f.num_batched_tokens, f.num_graph_rows) == (7, 4 * 5)  # 3 requests run as 4


def test_the_padded_search_reaches_the_brute_force_optimum():
    rng = random.Random(11)
    for _ in range(120):
        n = rng.randint(2, 5)
        rates = [rng.choice([rng.uniform(0, 0.3), rng.uniform(0.5, 0.95)]) for _ in range(n)]
        floors = [int(rng.random() < 0.1) for _ in range(n)]
        problem = problem_of(rates, random_cost(rng), floors=floors)
        result = best_plan(problem)
        assert all(k >= f for k, f in zip(result.ks, floors))
        assert result.goodput >= (1 - 1e-9) * brute_force(problem, 4)


def test_one_well_drafted_request_among_many_is_priced_at_the_padded_step():
    """16 requests, one drafting well: its chain of 4 alone makes the graph compute 16 x 5
    rows (+13% here, as on an H200 with SmolLM2, docs/benchmarks.md §4e-4f). Priced by its
    19 real rows that plan looked nearly free; at the padded rows it loses to no drafts, and
    the search finds what pays: every request one draft."""
    rates = [0.6] + [0.05] * 15
    cost = PaddedCost(4.0e-3, 0.52e-3 / 64, 0.0, 5e-6)  # 16 -> 80 rows: 4.13 -> 4.65 ms
    problem = problem_of(rates, cost)
    floors = problem.evaluate([0] * 16)
    lone = [4] + [0] * 15
    features = problem.features(lone)
    assert (features.num_batched_tokens, features.num_graph_rows) == (20, 80)
    real_rows = dataclasses.replace(features, num_graph_rows=0)
    assert cost.predict(real_rows) < 1.01 * floors.predicted_seconds  # what it was priced at
    assert problem.evaluate(lone).goodput < floors.goodput
    result = best_plan(problem)
    uniform = [problem.evaluate([k] * 16).goodput for k in range(5)]
    assert result.goodput >= (1 - 1e-12) * max(uniform)
    assert result.ks == (1,) * 16


def test_at_high_acceptance_every_request_shares_the_padded_rows():
    problem = problem_of([0.8] * 8, PaddedCost(3.0e-3, 2e-6, 1e-6, 2e-6))
    assert best_plan(problem).ks == (4,) * 8


def test_best_responses_at_the_plans_prices_are_the_plan():
    """The prices a padded plan was found at (its level, the linear costs at its longest chain
    K, responses held within K) give back every request's k: between searches the policy plans
    by them. The marginal costs at the plan (search.prices_at) price a draft past K at the
    jump in rows and give back fewer plans."""
    rng = random.Random(3)
    old = 0
    for _ in range(300):
        n = rng.randint(2, 12)
        rates = [rng.choice([rng.uniform(0, 0.3), rng.uniform(0.5, 0.95)]) for _ in range(n)]
        problem = problem_of(rates, random_cost(rng))
        margin = rng.choice([0.0, 0.03])  # the policy's DRAFT_MARGIN, in both
        result = best_plan(problem, margin)
        prices = plan_prices(problem, result)
        assert prices.longest == max(result.ks)
        slots = [options[0] for options in problem.options]
        ks = [best_response(s.gains, s.cap, s.floor, prices, margin) for s in slots]
        assert ks == list(result.ks)
        marginal = prices_at(problem, result)
        ks = [best_response(s.gains, s.cap, s.floor, marginal, margin) for s in slots]
        old += ks == list(result.ks)
    assert old < 290  # the reason for plan_prices (252 of 300 when it was written)
