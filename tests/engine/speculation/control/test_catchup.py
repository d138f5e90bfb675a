"""A separate draft model's catch-up (feeding every verified token since it last ran, the
whole context on a first run) is priced as catch-up: its own cost-model term, excluded from
the draft-pass coefficient, and part of the predicted cost of a draft option (a probe)."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from engine.config import SchedulerConfig, SpecConfig
from engine.outputs import ScheduledRequest
from engine.request import Request
from engine.sampling_params import SamplingParams
from engine.speculation.control import profiler
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.explore import EXPLORE_SHARE, FIRST_PROBES
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.policy import SpecCandidate
from engine.speculation.control.profiler import fit_to_pool
from engine.speculation.control.step_features import StepFeatures, profile_grid
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


def test_a_catchup_is_spread_over_the_steps_the_request_has_left():
    """Once fed, the draft model stays in step: a request with many tokens to go catches it
    up (2000 tokens, 0.1 s, spread over ~200 steps), one about to end or of unknown length
    does not (the whole 0.1 s on this step)."""
    policy = choice_policy(CatchupCost(0.01, 1e-3, per_draft_step=5e-4), explore_interval=1000)
    names = ["long", "short", "unknown"]
    teach_draft(policy, names, 0.9)
    left = {"long": 1000, "short": 6, "unknown": 0}
    batch = [SpecCandidate(n, 2200, 4, spec(n), 2000, num_remaining_tokens=left[n]) for n in names]
    for candidate in batch:  # one at a time: each plan is the request alone
        policy.plan([candidate], decode_base(1))
    assert spec("long").proposer == "draft"
    assert spec("short").proposer != "draft" and spec("unknown").proposer != "draft"


def test_a_forced_probe_is_predicted_with_its_catchup_and_waits_until_affordable():
    """A draft probe that first feeds 4000 tokens (0.2 s, twenty 10 ms steps) is forced only
    once the request has been idle long enough that it costs at most EXPLORE_SHARE of that
    time, and it is then predicted with its catch-up (the draft was verified elsewhere)."""
    cost = CatchupCost(0.01, 1e-3, per_draft_step=5e-4)
    policy = choice_policy(cost, explore_interval=1)
    teach_draft(policy, ["elsewhere"], 0.5)
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
    assert first >= 4000 * PER_CATCHUP_TOKEN / (EXPLORE_SHARE * step) - 2


def test_a_proposer_never_verified_is_probed_within_the_budget_of_all_plans():
    """Short requests, each 4000 tokens behind the draft model (0.2 s of catch-up): no one
    request is ever idle long enough to afford a probe, but a draft not yet settled is
    budgeted on all plans so far less what its probes spent (its prior is a guess every later
    choice rests on), so it is probed when they cover it, and again when they cover it twice;
    on the Qwen pair's chat the 0.5 prior had priced the draft out for good."""
    cost = CatchupCost(0.01, 1e-3, per_draft_step=5e-4)
    policy = choice_policy(cost, explore_interval=4)
    probes = []
    for index in range(800):
        name = f"r{index // 20}"  # a new request every 20 plans
        plan = policy.plan([SpecCandidate(name, 4200, 4, spec(name), 4000)], decode_base(1))
        if spec(name).proposer == "draft":
            probes.append(index)
            policy.observe([result(name, plan[name], 0, "draft")], decode_base(1), 0.2)
    step = cost.predict(decode_base(1))
    plans_needed = 4000 * PER_CATCHUP_TOKEN / (EXPLORE_SHARE * step)
    assert len(probes) == 2 and plans_needed - 2 <= probes[0] <= plans_needed + 25
    assert 2 * plans_needed - 2 <= probes[1] <= 2 * plans_needed + 25


class CatchupAt(LinearCost):
    """LinearCost plus `per_catchup` seconds per catch-up token."""

    def __init__(self, per_catchup: float, *args, **options) -> None:
        super().__init__(*args, **options)
        self.per_catchup = per_catchup

    def predict(self, f: StepFeatures) -> float:
        return super().predict(f) + self.per_catchup * f.num_catchup_tokens


def test_a_draft_model_never_verified_is_probed_while_it_is_in_step():
    """The Qwen pair on 2 cores (docs/benchmarks.md §5za): catching up a token costs more
    than EXPLORE_SHARE of a step, and at the 0.5 prior drafting does not pay. A probe that
    waited out the interval found the draft model a token further behind each plan, never
    affordable, and the draft model never ran. Until verified FIRST_PROBES times it is probed
    without waiting, while it is in step; then a request waits out the interval."""
    # catching up a token: 6% of a 19 ms decode step, more than EXPLORE_SHARE
    cost = CatchupAt(0.0011, 0.018, 1e-3, per_draft_step=0.01)
    policy = GoodputPolicy(cost, max_draft_tokens=4, draft_model=True)
    behind, plans = 0, []
    for _ in range(40):
        plan = policy.plan([SpecCandidate("a", 300 + behind, 4, spec("a"), behind)], decode_base(1))
        plans.append(plan.get("a", 0))
        behind = 0 if plan else behind + 1  # in step after drafting, else a token further behind
        if plan:
            policy.observe([result("a", plan["a"], 0)], decode_base(1), 0.03)
    first = FIRST_PROBES
    assert plans[:first] == [1] * first and sum(plans) == first  # then priced out
    plan = policy.plan([SpecCandidate("b", 300, 4, spec("b"), 0)], decode_base(1))
    assert plan == {}  # settled: no probe before the interval


def test_the_steps_a_driver_rests_count_on_the_exploration_clock():
    """While the driver rests (one plan in four, control/rest.py) a draft model idle on a
    request falls behind by a token a step. The rested steps count on the exploration clock,
    so the probe comes once the request was idle explore_interval steps, its catch-up within
    EXPLORE_SHARE of those steps' time; counted by plans, the catch-up grew four times faster
    than the budget and no probe came (docs/benchmarks.md §5za)."""
    cost = CatchupAt(0.0008, 0.018, 1e-3, per_draft_step=0.01)  # 4.2% of a step a token
    policy = GoodputPolicy(cost, max_draft_tokens=4, draft_model=True, explore_interval=16)
    for _ in range(FIRST_PROBES):  # settled: its drafts were all rejected
        policy.observe([result("x", 1, 0)], decode_base(1), 0.03)
    probes = []
    for step in range(120):  # one plan in four; the draft model a token further behind a step
        if step % 4:
            policy.rest_step()
            continue
        if policy.plan([SpecCandidate("a", 300 + step, 4, spec("a"), step)], decode_base(1)):
            probes.append(step)
    assert probes and probes[0] == 16


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


class RecordingRunner:
    """A draft runner that records each pass's queries and returns one logit row each."""

    def __init__(self, shares_target_cache: bool = False) -> None:
        self.shares_target_cache = shares_target_cache
        self.passes: list[list] = []

    def logits(self, queries):
        self.passes.append(list(queries))
        return torch.zeros(len(queries), 4)


def scheduled_step(shapes):
    """ScheduledRequests of (context, new, drafts) shapes, as the step timer builds them."""
    out = []
    for index, (context, num_new, num_drafts) in enumerate(shapes):
        request = Request(f"r{index}", [1] * (context + num_new), SamplingParams(max_tokens=1))
        request.block_ids = [index]
        out.append(ScheduledRequest(request, num_new + num_drafts, num_drafts, context))
    return out


def test_profile_passes_feed_the_catchup_before_the_first_draft():
    """The start-up profile's draft passes catch up as propose() does: the first pass feeds
    the catch-up tokens (shared among the drafting requests, each within its context) at the
    positions before its draft slot, the later passes one token each; a draft sharing the
    target's cache feeds none."""
    proposer = DraftModelProposer(RecordingRunner())
    shapes = [(100, 1, 2), (10, 1, 2), (50, 1, 0)]  # the third drafts nothing
    proposer.time_passes(scheduled_step(shapes), 2, lambda n: [7] * n, num_catchup_tokens=40)
    first, second = proposer.runner.passes
    assert [(len(q.token_ids), q.start) for q in first] == [(30, 72), (12, 0)]
    assert [(len(q.token_ids), q.start) for q in second] == [(1, 102), (1, 12)]
    selfdraft = DraftModelProposer(RecordingRunner(shares_target_cache=True))
    selfdraft.time_passes(scheduled_step(shapes), 1, lambda n: [7] * n, num_catchup_tokens=40)
    assert [(len(q.token_ids), q.start) for q in selfdraft.runner.passes[0]] == [(1, 101), (1, 11)]


def test_the_startup_profile_fits_the_catchup_term():
    """With a draft model the start-up grid has catch-up steps, the timer is asked for them,
    and the fit prices catch-up as the steps cost it (before: no such sample, priced 0)."""
    asked = []

    class Timer:
        num_blocks, block_size, max_model_len = 4096, 16, 4096
        identity = ("m", "cpu", "float32", 1)

        def __call__(self, shapes, num_draft_passes=0, draft_passes=None, num_catchup_tokens=0):
            asked.append(num_catchup_tokens)
            f = StepFeatures.from_shapes(shapes, draft_model=True)
            return true_seconds(f) + PER_CATCHUP_TOKEN * num_catchup_tokens

    model = OnlineLinearCostModel()
    config = SpecConfig(spec_profile_seconds=30.0, spec_cost_cache=None)
    report = profiler.seed_cost_model(
        model, Timer(), config, SchedulerConfig(), 4, draft_passes=lambda *args: 0.0
    )
    assert report.source == "profile" and sorted(set(asked))[1:] == [64, 256]
    assert model.coefficients()["catchup_tokens"] == pytest.approx(PER_CATCHUP_TOKEN, rel=0.05)
    assert f"|grid={profiler.GRID_VERSION}" in report.key


def test_the_grid_has_catchup_steps_only_with_a_draft_model():
    with_draft = profile_grid(max_context=512, draft_model=True)
    assert sorted(f.num_catchup_tokens for f in with_draft if f.num_catchup_tokens) == [64, 256]
    assert all(
        f.num_requests == 1 and f.num_draft_steps == 1 for f in with_draft if f.num_catchup_tokens
    )
    assert not any(f.num_catchup_tokens for f in profile_grid(max_context=512))
    fitted = fit_to_pool(with_draft, num_blocks=64, block_size=16, max_model_len=100)
    assert sorted(f.num_catchup_tokens for f in fitted if f.num_catchup_tokens) == [64, 98]
