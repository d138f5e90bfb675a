"""A plan's options (plan_options.py) read three ways: as SearchSlots by the search, as one
OptionTable and slot by slot in Python by the best responses between searches. The three
must agree, and prices are now held with proposer choice and a draft model too."""

from __future__ import annotations

import random

import numpy as np
import pytest

from engine.speculation.control import plan_options as plan_options_module
from engine.speculation.control.acceptance import expected_emitted
from engine.speculation.control.goodput import DRAFT_MARGIN, HOLD_TOLERANCE, GoodputPolicy
from engine.speculation.control.plan_options import PlanOptions
from engine.speculation.control.search import Prices, best_responses
from engine.speculation.control.search_problem import OptionTable
from tests.engine.speculation.control.test_goodput import LinearCost, decode_base
from tests.engine.speculation.test_proposer_choice import (  # noqa: F401 - fresh_records: autouse
    NAMES,
    candidates,
    choice_policy,
    fresh_records,
    spec,
    teach,
)


def random_options(rng: random.Random, trees: bool = False) -> PlanOptions:
    n, m = rng.randint(1, 6), rng.randint(1, 3)
    draft = tuple(rng.random() < 0.4 for _ in range(m))
    nodes = None
    if trees:
        nodes = [sorted((rng.random() for _ in range(6)), reverse=True) for _ in range(n * m)]
    options = PlanOptions(
        tuple(f"p{j}" for j in range(m)),
        draft,
        tuple(rng.uniform(0.5, 1.0) for _ in range(m)),
        [rng.random() for _ in range(n * m)],
        [rng.randint(0, 5) for _ in range(n * m)],
        [0] * (n * m),
        [rng.choice([0.0, rng.uniform(0, 2e-3)]) for _ in range(n * m)],
        nodes,
    )
    if rng.random() < 0.5:
        options.force(rng.randrange(n), rng.randrange(m))
    return options


def random_prices(rng: random.Random) -> Prices:
    return Prices(
        level=rng.uniform(20, 400),
        per_token=rng.uniform(1e-5, 3e-3),
        per_request=rng.uniform(0, 3e-3),
        longest=rng.choice([None, 0, 1, 2, 4]),
        passes=rng.randint(0, 4),
        per_draft_request=rng.uniform(0, 5e-3),
    )


@pytest.mark.parametrize("trees", [False, True])
def test_responses_in_python_are_the_tables(trees):
    rng = random.Random(trees)
    for _ in range(300):
        options, prices = random_options(rng, trees), random_prices(rng)
        margin = rng.choice([0.0, DRAFT_MARGIN])
        level = prices.level * (1.0 + margin)
        one_by_one = [options._response(i, prices, level) for i in range(options.num_candidates)]
        ks, picks = best_responses(options.table(), prices, margin)
        assert one_by_one == list(zip(ks, picks))


def test_the_table_is_the_search_slots_table():
    rng = random.Random(1)
    for trees in (False, True):
        options = random_options(rng, trees)
        options.floors = [0] * len(options.caps)  # no probe
        flags = [list(options.draft)] * options.num_candidates
        ours, theirs = options.table(), OptionTable.of(options.slots(), flags)
        for name in ("cumulative", "depths", "floors", "caps", "seconds", "draft"):
            np.testing.assert_allclose(getattr(ours, name), getattr(theirs, name), rtol=1e-12)


def test_a_probe_rules_out_the_candidates_other_options():
    options = random_options(random.Random(2))
    options.force(0, 0)
    assert [s.proposer for s in options.slots()[0]] == ["p0"]
    assert options.slots()[0][0].floor == 1


@pytest.mark.parametrize("batch", [2, 8])
@pytest.mark.parametrize("scalar", [True, False])
def test_prices_are_held_with_proposer_choice_and_a_draft_model(batch, scalar, monkeypatch):
    """Where the requests share the draft model's passes (it is their best proposer here),
    the next plan after a search is the best responses at its prices (no search), slot by
    slot in Python or as a table, within the tolerance of the search's goodput (each
    response's drafts must beat the level by DRAFT_MARGIN, so it may drop a draft the search
    kept)."""
    monkeypatch.setattr(plan_options_module, "SCALAR_OPTIONS", 10**6 if scalar else 0)
    cost = LinearCost(0.01, 1e-3, per_draft_step=0.002)
    policy = choice_policy(cost, explore_interval=1000)
    ids = [f"h{batch}r{i}" for i in range(batch)]
    rng = random.Random(batch)
    for request_id in ids:
        rates = {name: rng.uniform(0.2, 0.6) for name in NAMES}
        teach(policy, request_id, {**rates, "draft": rng.uniform(0.85, 0.95)})
    searched = goodput(policy, cost, ids, policy.plan(candidates(*ids), decode_base(batch)))
    assert policy._prices is not None and policy._plans_since_search == 0
    responded = goodput(policy, cost, ids, policy.plan(candidates(*ids), decode_base(batch)))
    assert policy._plans_since_search == 1
    assert responded >= (1.0 - HOLD_TOLERANCE) * searched


def goodput(policy: GoodputPolicy, cost: LinearCost, ids: list[str], plan: dict[str, int]):
    """The plan's expected tokens per second, each request at its chosen proposer's rate."""
    chosen = {r: spec(r).proposer for r in plan}
    emitted = sum(expected_emitted(policy.rate(spec(r), chosen[r]), k) for r, k in plan.items())
    passes = max((k for r, k in plan.items() if chosen[r] == "draft"), default=0)
    features = decode_base(len(ids)).with_drafts(sum(plan.values()), len(plan), passes)
    return (len(ids) + emitted - len(plan)) / cost.predict(features)


@pytest.mark.parametrize("proposers", [(), ("ngram", "draft")])
def test_no_prices_are_held_where_fewer_than_two_requests_share_the_draft_models_passes(
    proposers,
):
    """A lone draft-model user would count its passes as paid between searches, and with no
    user the draft model could not start: such plans are searched every step."""
    cost = LinearCost(0.03, 1e-3, per_draft_step=0.004)
    policy = GoodputPolicy(
        cost, max_draft_tokens=4, draft_model=True, proposers=proposers, explore_interval=1000
    )
    name = "draft" if proposers else ""
    teach(policy, "lone", {name: 0.9, "ngram": 0.05} if proposers else {name: 0.9})
    teach(policy, "idle", {name: 0.01, "ngram": 0.01} if proposers else {name: 0.01})
    for batch in (["lone"], ["idle"]):
        for _ in range(3):
            policy.plan(candidates(*batch), decode_base(1))
            assert policy._prices is None and policy._plans_since_search == 0
