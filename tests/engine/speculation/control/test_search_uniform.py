"""The search's uniform plans (the m requests with the best first draft at min(c, cap), the
rest at their floors), found with running sums over arrays, against a plain loop that builds
and evaluates every such plan."""

from __future__ import annotations

import random

import pytest

from engine.speculation.control import uniform_plans
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.search import SearchProblem, SearchResult, SearchSlot
from engine.speculation.control.step_features import StepFeatures, profile_grid
from tests.engine.speculation.control.test_goodput import LinearCost


def fitted_cost_model() -> OnlineLinearCostModel:
    """A fitted cost model with the vectorised prediction (row ramps, draft passes)."""
    model = OnlineLinearCostModel()
    grid = profile_grid(max_draft_tokens=6, draft_model=True)
    model.fit([(f, 0.02 + 4e-4 * f.num_batched_tokens + 4e-3 * f.num_draft_steps) for f in grid])
    return model


def uniform_by_loop(problem: SearchProblem, best: SearchResult, picks: list[int]) -> SearchResult:
    slots = problem.chosen(picks)
    order = sorted(range(len(slots)), key=lambda i: -slots[i].cumulative[min(1, slots[i].cap)])
    counts = sorted(uniform_plans._checked_counts(len(slots)))
    for c in range(1, max(s.cap for s in slots) + 1):
        for m in counts:
            ks = [s.floor for s in slots]
            for i in order[:m]:
                ks[i] = max(slots[i].floor, min(c, slots[i].cap))
            if not problem.fits(ks):
                continue
            result = problem.evaluate(ks, picks)
            if result.goodput > best.goodput * (1.0 + 1e-9):
                best = result
    return best


def random_problem(rng: random.Random, cost) -> SearchProblem:
    n, proposers = rng.choice([2, 3, 7, 12, 40]), rng.choice([1, 2, 3])
    slots = []
    for _ in range(n):
        options = []
        for j in range(proposers):
            cap, a = rng.randint(0, 6), rng.random()
            gains = [a**t for t in range(1, cap + 1)]
            floor = int(cap > 0 and rng.random() < 0.1)
            draft = j == proposers - 1 and rng.random() < 0.6 if proposers > 1 else None
            seconds = rng.choice([0.0, 1e-4, 5e-4])
            options.append(
                SearchSlot(gains, range(1, cap + 1), cap, floor, f"p{j}", draft, seconds)
            )
        slots.append(options if proposers > 1 else options[0])
    base = StepFeatures.from_shapes([(rng.randint(10, 900), 1, 0)] * n)
    budget = rng.choice([None, base.num_batched_tokens + rng.randint(0, 3 * n)])
    draft_model = rng.random() < 0.3
    return SearchProblem(slots, base, cost, draft_model, token_budget=budget, sunk_seconds=1e-3)


@pytest.mark.parametrize("cost", ["fitted", "linear"])
def test_the_uniform_plans_are_the_best_of_every_plan_a_loop_builds(cost):
    model = fitted_cost_model() if cost == "fitted" else LinearCost(0.01, 1e-3, 0.004, 5e-4)
    rng = random.Random(7)
    checked = 0
    for _ in range(150):
        problem = random_problem(rng, model)
        floors = problem.evaluate([options[0].floor for options in problem.options])
        every_set, by_loop = uniform_plans.uniform_picks(problem), floors
        for picks in every_set:
            found = uniform_plans.best_uniform(problem, floors, [picks])
            expected = uniform_by_loop(problem, floors, picks)
            assert found.goodput == pytest.approx(expected.goodput, rel=1e-9)
            assert problem.evaluate(found.ks, found.picks).goodput == pytest.approx(found.goodput)
            if found is not floors:  # a plan it found (the floors may overrun the budget)
                assert problem.fits(found.ks)
                checked += 1
            by_loop = uniform_by_loop(problem, by_loop, picks)
        # every set at once: the best over them, an earlier set's plan kept on ties
        found = uniform_plans.best_uniform(problem, floors, every_set)
        assert found.goodput == pytest.approx(by_loop.goodput, rel=1e-9)
        assert found.picks == by_loop.picks
    assert checked > 50  # most problems have a uniform plan better than no drafts
