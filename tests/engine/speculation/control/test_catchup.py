"""A separate draft model's catch-up (feeding every verified token since it last ran, the
whole context on a first run) is priced as catch-up: its own cost-model term, excluded from
the draft-pass coefficient, and part of the predicted cost of a draft option (a probe)."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest

from engine.speculation.control import goodput as goodput_module
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.policy import SpecCandidate
from engine.speculation.control.step_features import StepFeatures
from engine.speculation.proposers.draft_model import DraftModelProposer, _RequestState
from tests.engine.speculation.control.test_cost_model import TRUE, random_features, true_seconds
from tests.engine.speculation.control.test_goodput import LinearCost, decode_base, result
from tests.engine.speculation.test_proposer_choice import (  # noqa: F401 - fresh_records: autouse
    choice_policy,
    fresh_records,
    spec,
)

PER_CATCHUP_TOKEN = 5e-5


def test_catchup_is_learned_apart_from_draft_passes():
    """Draft-model steps after an idle spell feed hundreds of tokens first: the fit keeps the
    pass coefficient and learns the catch-up one (before, catch-up inflated draft_steps)."""
    rng, model = random.Random(3), OnlineLinearCostModel()
    for _ in range(800):
        f = random_features(rng)
        if f.num_draft_steps and rng.random() < 0.3:
            f = dataclasses.replace(f, num_catchup_tokens=rng.randint(50, 2000))
        seconds = true_seconds(f) + PER_CATCHUP_TOKEN * f.num_catchup_tokens
        model.observe(f, seconds * rng.gauss(1.0, 0.02))
    fitted = model.coefficients()
    assert fitted["draft_steps"] == pytest.approx(TRUE["draft_steps"], rel=0.25)
    assert fitted["catchup_tokens"] == pytest.approx(PER_CATCHUP_TOKEN, rel=0.1)
    assert StepFeatures().with_drafts(2, 1).num_catchup_tokens == 0
    fed = StepFeatures(num_catchup_tokens=7).with_drafts(2, 1)
    assert fed.num_catchup_tokens == 7  # with_drafts keeps it


class CatchupCost(LinearCost):
    def predict(self, f: StepFeatures) -> float:
        return super().predict(f) + PER_CATCHUP_TOKEN * f.num_catchup_tokens


def test_a_draft_option_pays_its_catchup():
    """Two requests alike but for the draft model's lag: the synced one drafts with it, the
    one 4000 tokens behind (0.2 s of catch-up) does not."""
    policy = choice_policy(CatchupCost(0.01, 1e-3, per_draft_step=5e-4), explore_interval=1000)
    batch = [
        SpecCandidate("synced", 200, 4, spec("synced"), 0),
        SpecCandidate("behind", 4200, 4, spec("behind"), 4000),
    ]
    teach_draft(policy, ["synced", "behind"], 0.9)
    policy.plan(batch, decode_base(2))
    assert spec("synced").proposer == "draft"
    assert spec("behind").proposer != "draft"


def test_a_forced_probe_is_predicted_with_its_catchup_and_waits_until_affordable():
    """A draft probe that first feeds 4000 tokens (0.2 s, twenty 10 ms steps) is forced only
    once the request has been idle long enough that it costs at most EXPLORE_SHARE of that
    time, and it is then predicted with its catch-up."""
    cost = CatchupCost(0.01, 1e-3, per_draft_step=5e-4)
    policy = choice_policy(cost, explore_interval=1)
    batch = [SpecCandidate("behind", 4200, 4, spec("behind"), 4000)]
    seen, first = [], None
    for index in range(600):
        planning = policy.plan_seconds  # the objective pays it too (test_plan_cost.py)
        plan = policy.plan(batch, decode_base(1))
        if spec("behind").proposer == "draft":
            first = index if first is None else first
            k = plan["behind"]
            f = decode_base(1).with_drafts(k, 1, k)
            seen.append(policy.last_predicted_step_time - planning - cost.predict(f))
    assert seen and all(extra == pytest.approx(4000 * PER_CATCHUP_TOKEN) for extra in seen)
    step = cost.predict(decode_base(1))
    assert first >= 4000 * PER_CATCHUP_TOKEN / (goodput_module.EXPLORE_SHARE * step) - 2


def teach_draft(policy, request_ids, rate: float) -> None:
    rng = random.Random(0)
    for request_id in request_ids:
        for _ in range(40):
            accepted = 0
            while accepted < 4 and rng.random() < rate:
                accepted += 1
            policy.observe([result(request_id, 4, accepted, "draft")], decode_base(1), 0.01)


def test_the_draft_model_counts_the_tokens_its_catchup_feeds():
    proposer = DraftModelProposer.__new__(DraftModelProposer)
    proposer.runner = SimpleNamespace(shares_target_cache=False)
    memos: dict = {}
    assert proposer.catchup_tokens(memos, 120) == 119  # first run: the whole context
    memos["draft"] = _RequestState(num_computed=100)
    assert proposer.catchup_tokens(memos, 120) == 19
    proposer.runner = SimpleNamespace(shares_target_cache=True)
    assert proposer.catchup_tokens(memos, 120) == 0  # a self-draft reads the target's cache
