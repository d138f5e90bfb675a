"""Planning is part of the step: the policy prices its own planning time in the objective
(GoodputPolicy.plan_seconds, measured), and the driver counts it in the step's time."""

from __future__ import annotations

import pytest

from engine.speculation.control.goodput import GoodputPolicy
from tests.engine.speculation.control.test_goodput import (  # noqa: F401 - fresh_records: autouse
    LinearCost,
    candidates,
    decode_base,
    fresh_records,
    teach,
)


def planned(overhead: float) -> tuple[dict[str, int], float, float]:
    """(plan, its predicted seconds, the cost model's seconds of its features) at a planning
    overhead of `overhead` seconds."""
    cost = LinearCost(0.01, 2e-3)
    policy = GoodputPolicy(cost, max_draft_tokens=8, prior=0.5, explore_interval=1000)
    teach(policy, "a", 0.6)
    policy.plan_seconds = overhead
    plan = policy.plan(candidates("a"), decode_base(1))
    features = decode_base(1).with_drafts(sum(plan.values()), len(plan))
    return plan, policy.last_predicted_step_time, cost.predict(features)


def test_the_objective_pays_the_planning_time():
    plan, predicted, modelled = planned(0.0)
    assert predicted == pytest.approx(modelled)
    slow_plan, slow_predicted, slow_modelled = planned(0.05)
    assert slow_predicted == pytest.approx(slow_modelled + 0.05)
    # A fixed cost per step makes each step's tokens dearer: longer chains pay off.
    assert slow_plan.get("a", 0) > plan.get("a", 0)


def test_the_policy_measures_its_own_planning():
    policy = GoodputPolicy(LinearCost(0.01, 2e-3), max_draft_tokens=4, prior=0.5)
    assert policy.plan_seconds == 0.0
    policy.plan(candidates("a", "b"), decode_base(2))
    assert policy.plan_seconds > 0.0
