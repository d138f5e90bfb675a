"""The off and fixed policies and the policy-spec parser."""

from __future__ import annotations

import pytest

from engine.request import SpecState
from engine.speculation.build import make_policy
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.policy import FixedPolicy, OffPolicy, SpecCandidate, SpecResult
from engine.speculation.control.step_features import StepFeatures

BASE = StepFeatures.from_shapes([(100, 1, 0)] * 3)
CANDIDATES = [SpecCandidate(i, 100, k, SpecState()) for i, k in (("a", 8), ("b", 2), ("c", 0))]


def test_off_never_speculates():
    policy = OffPolicy()
    assert policy.plan(CANDIDATES, BASE) == {}
    assert policy.last_predicted_step_time is None
    policy.observe([SpecResult("a", 3, 1, spec=CANDIDATES[0].spec)], BASE, 0.01)
    assert policy.plan(CANDIDATES, BASE) == {}
    assert CANDIDATES[0].spec == SpecState()  # learned nothing about the request


def test_fixed_gives_k_capped_by_each_request_and_omits_zero():
    fixed = FixedPolicy(3)
    assert fixed.plan(CANDIDATES, BASE) == {"a": 3, "b": 2}
    assert fixed.last_predicted_step_time is None
    assert FixedPolicy(0).plan(CANDIDATES, BASE) == {}
    assert FixedPolicy(3).plan([], BASE) == {}


def test_make_policy_parses_every_spec():
    assert isinstance(make_policy("off"), OffPolicy)
    fixed = make_policy(" Fixed:5 ")
    assert isinstance(fixed, FixedPolicy) and fixed.num_draft_tokens == 5
    model = OnlineLinearCostModel()
    goodput = make_policy("goodput", cost_model=model, max_draft_tokens=6, explore_interval=4)
    assert isinstance(goodput, GoodputPolicy)
    assert (
        goodput.cost_model is model
        and goodput.max_draft_tokens == 6
        and goodput.explore_interval == 4
    )
    assert isinstance(make_policy("goodput").cost_model, OnlineLinearCostModel)


@pytest.mark.parametrize("spec", ["fixed", "fixed:", "fixed:-1", "fixed:two", "fast", ""])
def test_make_policy_rejects_bad_specs_and_says_what_is_allowed(spec):
    with pytest.raises(ValueError, match="'off', 'fixed:K'"):
        make_policy(spec)
