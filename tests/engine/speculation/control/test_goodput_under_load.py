"""The goodput policy under load: drafts valued by how the estimates acted on came true
(calibration), and priced at the goodput of the decoding requests, not of a step diluted by
prefill chunks (docs/benchmarks.md §5l: on SmolLM2 chat under Poisson load both made goodput
slower than no speculation)."""

from __future__ import annotations

import pytest

from engine.speculation.control.acceptance import CALIBRATION_FLOOR, AcceptanceEstimator
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.policy import SpecCandidate
from engine.speculation.control.step_features import StepFeatures
from tests.engine.speculation.control.test_goodput import (  # noqa: F401 - fresh_records
    LinearCost,
    candidate,
    decode_base,
    fresh_records,
    result,
    spec,
    teach,
)


def test_calibration_starts_at_one_follows_the_outcomes_and_stays_in_bounds():
    estimator = AcceptanceEstimator()
    assert estimator.calibration == 1.0
    for _ in range(300):
        estimator.calibrate(expected=2.0, accepted=1)
    assert estimator.calibration == pytest.approx(0.5, abs=0.01)
    for _ in range(300):
        estimator.calibrate(expected=1.0, accepted=3)  # pessimistic estimates: not above 1
    assert estimator.calibration == 1.0
    for _ in range(300):
        estimator.calibrate(expected=1.0, accepted=0)
    assert estimator.calibration == CALIBRATION_FLOOR
    estimator.calibrate(expected=0.0, accepted=0)  # nothing expected: nothing learned
    assert estimator.calibration == CALIBRATION_FLOOR


def test_a_plan_records_what_its_estimate_expects_and_observe_calibrates_by_it():
    policy = GoodputPolicy(LinearCost(intercept=0.02, per_token=1e-4), max_draft_tokens=3)
    teach(policy, "a", 0.8)
    a = policy.rate(spec("a"))
    plan = policy.plan([candidate("a", 3)], decode_base(1))
    assert plan == {"a": 3}
    assert spec("a").expected == pytest.approx([a, a**2, a**3])
    policy.observe([result("a", 3, 0)], decode_base(1).with_drafts(3, 1), 0.02)
    expected = sum(spec("a").expected)
    calibration = (8.0 * 0.98) / (8.0 * 0.98 + expected)  # CALIBRATION_PRIOR, _DECAY
    assert policy.acceptance.calibration == pytest.approx(calibration)
    policy.plan([candidate("b", 3)], decode_base(1))
    assert spec("a").expected == pytest.approx([a, a**2, a**3])  # "a" was not planned again


def test_drafts_whose_estimates_came_true_half_as_often_are_valued_at_half():
    """Same estimate, same costs: the policy whose past drafts were accepted half as often as
    expected gives a marginal request fewer drafts."""
    cost = LinearCost(intercept=0.01, per_token=2.5e-3)
    trusting, burnt = (GoodputPolicy(cost, max_draft_tokens=4) for _ in range(2))
    for _ in range(300):
        burnt.acceptance.calibrate(expected=2.0, accepted=1)
    ks = {}
    for name, policy in (("trusting", trusting), ("burnt", burnt)):
        teach(policy, f"{name}-r", 0.5)
        plan = policy.plan([candidate(f"{name}-r", 4)], decode_base(1))
        ks[name] = plan.get(f"{name}-r", 0)
    assert ks["trusting"] >= 1
    assert ks["burnt"] < ks["trusting"]


def with_prefill(candidates: list[SpecCandidate], chunk: int) -> StepFeatures:
    """The candidates' decodes plus one request's prefill chunk of `chunk` tokens."""
    decodes = [(c.context_len - 1, 1, 0) for c in candidates]
    return StepFeatures.from_shapes([*decodes, (0, chunk, 0)])


@pytest.mark.parametrize("acceptance, drafts", [(0.1, False), (0.6, True)])
def test_a_prefill_chunk_does_not_make_drafts_look_cheap(acceptance, drafts):
    """One decoding request (10 ms + 2 ms a row: a first draft pays above a = 1/6) beside a
    200-token prefill chunk (0.4 s more): counted in the ratio, the chunk would make any
    draft with a > 0.005 pay."""
    cost = LinearCost(intercept=0.01, per_token=2e-3)
    policy = GoodputPolicy(cost, max_draft_tokens=4, explore_interval=1000)
    teach(policy, "r", acceptance, rounds=200)
    batch = [candidate("r", 4)]
    base = with_prefill(batch, 200)
    plan = policy.plan(batch, base)
    assert bool(plan) is drafts
    assert plan == policy.plan(batch, decode_base(1, context_len=199))  # as if decoding alone
    # The metrics' predicted step time is still the whole step's.
    predicted = cost.predict(base.with_drafts(plan.get("r", 0), len(plan)))
    planning = policy.plan_seconds  # the search's overhead; updated after the plan
    policy.plan(batch, base)
    assert policy.last_predicted_step_time == pytest.approx(predicted + planning)


@pytest.mark.parametrize("acceptance, drafts", [(0.45, False), (0.85, True)])
def test_a_lone_candidate_is_priced_at_the_goodput_of_every_decode_in_the_step(acceptance, drafts):
    """Four decodes at 2 ms + 0.8 ms a row (SmolLM2 at four chat requests on Zen 5: ~2.6
    ms alone, ~4.3 ms for four, a draft row ~0.8 ms), one of them able to draft: a draft
    pays where its gain beats 0.8 ms at the four decodes' 4 tokens / 5.2 ms (a > ~0.62),
    not at the lone request's own 1 token / 2.8 ms (a > ~0.29), which drafted one-token
    chains at ~0.45 that never came (docs/benchmarks.md §5ze)."""
    policy = GoodputPolicy(LinearCost(intercept=2e-3, per_token=0.8e-3), max_draft_tokens=1)
    policy.explore_interval = 1000
    teach(policy, "r", acceptance, rounds=400)
    others = [candidate(f"other-{i}", 0) for i in range(3)]
    plan = policy.plan([candidate("r", 1), *others], decode_base(4))
    assert bool(plan) is drafts and set(plan) <= {"r"}
    assert policy.plan(others, decode_base(4)) == {}  # nobody can draft: no plan
