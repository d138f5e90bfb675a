"""The search's array views of a problem's options against plain loops over the options: the
option table (its chain fast path against the general build), each slot's uniform-plan picks,
and the dominated options dropped."""

from __future__ import annotations

import random

import numpy as np

from engine.speculation.control import uniform_plans
from engine.speculation.control.search import SearchProblem, SearchSlot
from engine.speculation.control.search_problem import OptionTable
from engine.speculation.control.step_features import StepFeatures
from tests.engine.speculation.control.test_search_uniform import fitted_cost_model, random_problem


def as_tuples(options):
    """The same options with their depths as tuples: OptionTable.of takes its general path."""
    return [
        [
            SearchSlot(
                s.gains, tuple(s.depths), s.cap, s.floor, s.proposer, s.draft, s.propose_seconds
            )
            for s in slot
        ]
        for slot in options
    ]


def test_the_chain_table_equals_the_general_build():
    rng, model = random.Random(3), fitted_cost_model()
    for _ in range(60):
        problem = random_problem(rng, model)
        if rng.random() < 0.5:  # slots with fewer options than others: padded with missing ones
            slots = [list(options) for options in problem.options]
            slots[0] = slots[0][:1]
            problem = SearchProblem(slots, problem.base, model, problem.draft_model)
        fast = problem.table
        general = OptionTable.of(as_tuples(problem.options), problem.draft_flags)
        for name in ("cumulative", "depths", "floors", "caps", "seconds", "draft"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(general, name), err_msg=name)


def picks_by_ranking(problem: SearchProblem) -> list[list[int]]:
    """Each slot's first model-free and first draft-model option by first gain (the lowest
    index on ties), 0 where it has none of that kind."""
    free, draft = [], []
    for options, flags in zip(problem.options, problem.draft_flags):
        ranked = sorted((-o.cumulative[min(1, o.cap)], i) for i, o in enumerate(options))
        free.append(next((i for _, i in ranked if not flags[i]), 0))
        draft.append(next((i for _, i in ranked if flags[i]), 0))
    if not problem.any_draft:
        return [free]
    return [free, draft] if problem.any_free else [draft]


def test_uniform_picks_rank_by_the_first_gain_with_ties_to_the_first_option():
    rng, model = random.Random(5), fitted_cost_model()
    tied = 0
    for _ in range(200):
        problem = random_problem(rng, model)
        if rng.random() < 0.5:  # a slot's options share their first gain: ties to break
            first = rng.random()
            slots = [
                [
                    SearchSlot(
                        [first] + [rng.random() for _ in range(2)],
                        o.depths,
                        3,
                        0,
                        o.proposer,
                        o.draft,
                    )
                    for o in options
                ]
                for options in problem.options
            ]
            problem = SearchProblem(slots, problem.base, model, problem.draft_model)
            tied += sum(len(options) > 1 for options in problem.options)
        assert uniform_plans.uniform_picks(problem) == picks_by_ranking(problem)
    assert tied > 200  # slots left with several options after the dominated ones went


def test_an_option_another_gains_more_than_everywhere_is_dropped_and_a_tie_keeps_the_first():
    model = fitted_cost_model()
    strong = SearchSlot([0.9, 0.8, 0.7], range(1, 4), 3, proposer="a", draft=False)
    weak = SearchSlot([0.5, 0.4, 0.3], range(1, 4), 3, proposer="b", draft=False)
    twin = SearchSlot([0.9, 0.8, 0.7], range(1, 4), 3, proposer="c", draft=False)
    crossing = SearchSlot([0.95, 0.1, 0.0], range(1, 4), 3, proposer="d", draft=False)
    dearer = SearchSlot(
        [0.9, 0.8, 0.7], range(1, 4), 3, proposer="e", draft=False, propose_seconds=1e-3
    )
    drafted = SearchSlot([0.2, 0.1, 0.0], range(1, 4), 3, proposer="draft", draft=True)
    problem = SearchProblem(
        [[weak, strong, twin, crossing, dearer, drafted]], StepFeatures(), model
    )
    assert [o.proposer for o in problem.options[0]] == ["a", "d", "draft"]


def kept_by_loop(options: list[SearchSlot], draft_model: bool) -> list[SearchSlot]:
    """Each option unless another of its kind is as good at every k (plain loops)."""

    def kind(o: SearchSlot) -> bool:
        return draft_model if o.draft is None else o.draft

    def as_good(p: SearchSlot, o: SearchSlot, earlier: bool) -> bool:
        if (p.floor, kind(p)) != (o.floor, kind(o)) or p.cap < o.cap:
            return False
        if p.propose_seconds > o.propose_seconds:
            return False
        ks = range(1, o.cap + 1)
        if any(p.cumulative[k] < o.cumulative[k] for k in ks):
            return False
        if kind(o) and any(p.depths[k - 1] > o.depths[k - 1] for k in ks):
            return False
        tie = (p.cap, p.propose_seconds) == (o.cap, o.propose_seconds) and all(
            p.cumulative[k] == o.cumulative[k] for k in ks
        )
        return earlier or not tie

    return [
        o
        for i, o in enumerate(options)
        if not any(j != i and as_good(p, o, j < i) for j, p in enumerate(options))
    ]


def test_the_kept_options_and_their_flags_match_a_loop_over_every_pair():
    rng = random.Random(3)
    dropped = 0
    for _ in range(300):
        draft_model = rng.random() < 0.5
        slots = []
        for _ in range(rng.randint(1, 6)):
            options = []
            for _ in range(rng.randint(1, 4)):
                cap = rng.randint(0, 4)
                gains = [rng.choice([0.2, 0.5, 0.9]) for _ in range(cap)]
                depths = range(1, cap + 1) if rng.random() < 0.7 else (1, 1, 2, 3)[:cap]
                options.append(
                    SearchSlot(
                        gains,
                        depths,
                        cap,
                        floor=int(rng.random() < 0.1),
                        draft=rng.choice([None, False, True]),
                        propose_seconds=rng.choice([0.0, 1e-4]),
                    )
                )
            slots.append(options if len(options) > 1 or rng.random() < 0.5 else options[0])
        problem = SearchProblem(slots, StepFeatures(), fitted_cost_model(), draft_model)
        for slot, kept, flags in zip(slots, problem.options, problem.draft_flags):
            options = slot if isinstance(slot, list) else [slot]
            expected = kept_by_loop(options, draft_model)
            assert list(kept) == expected
            assert list(flags) == [problem.runs_draft(o) for o in expected]
            dropped += len(options) - len(kept)
    assert dropped > 100  # the gains drawn from three values tie and dominate often
