"""SpecDriver rests (engine/speculation/control/rest.py): a policy that prices drafts
(goodput) whose last REST_AFTER plans drafted nothing, or whose accepted drafts over the last
REST_AFTER planning steps were worth less than planning and the drafts' measured extra time, is
asked for a plan REST_EVERY steps into the rest, then after twice as many, up to REST_DEEPEST
steps apart; a plan that drafts, or a ledger that pays again, ends the rest; none starts where
planning is cheap and the long ledger (REST_HORIZON planning steps) says speculation paid;
fixed:k never rests, and fewer than REST_FROM requests rest only while the long ledger, too,
says speculation did not pay. A rested step is observed by the policy one in REST_SEEN_EVERY.
Pure Python: stub policy and proposer, factory requests."""

from __future__ import annotations

import pytest

from engine.config import SpecConfig
from engine.outputs import (
    Drafts,
    ModelOutput,
    RequestStepOutput,
    ScheduledRequest,
    SchedulerOutput,
)
from engine.request import RequestStatus
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.policy import FixedPolicy, SpecPolicy, SpecResult
from engine.speculation.control.rest import (
    REST_AFTER,
    REST_DEEPEST,
    REST_EVERY,
    REST_FAR,
    REST_FEW_AFTER,
    REST_FROM,
    REST_HORIZON,
    REST_MIN_SHARE,
    REST_NEAR,
    SHORT_CHAIN,
    PlanningRest,
    batch_class,
)
from engine.speculation.driver import REST_SEEN_EVERY, WAKE_ACCEPTED, SpecDriver
from tests.engine.factories import make_requests


class CountingPolicy(SpecPolicy):
    """Plans `answer`; counts its plans and the steps the driver rested."""

    rests = True

    def __init__(self) -> None:
        self.answer: dict[str, int] = {}
        self.calls = 0
        self.rested = 0

    def plan(self, candidates, base):
        self.calls += 1
        self.caps = {c.request_id: c.max_draft_tokens for c in candidates}
        return dict(self.answer)

    def rest_step(self) -> None:
        self.rested += 1

    def observe(self, results, features, step_seconds) -> None:
        self.observed = getattr(self, "observed", 0) + 1


class NoOffers:
    """A proposer that cannot say before the plan what it would draft (no `offer`)."""

    name = "ngram"
    target_topk = 0

    def observe(self, observations) -> None:
        pass


class CountingShadows:
    """ShadowChecks that count the steps they were started on."""

    def __init__(self) -> None:
        self.starts = 0

    def start(self, requests) -> None:
        self.starts += 1


def driver_with(policy: SpecPolicy, shadows: CountingShadows | None = None) -> SpecDriver:
    config = SpecConfig(proposer="ngram", spec_policy="goodput")
    return SpecDriver(
        config, NoOffers(), policy, OnlineLinearCostModel(), None, 64, shadows=shadows
    )


def caught_up_requests(count: int = REST_FROM):
    requests = make_requests(count)
    for request in requests:
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens - 1
    return requests


def plans(driver: SpecDriver, requests, steps: int) -> list[dict[str, int]]:
    return [driver.plan(requests) for _ in range(steps)]


def resting_plans(steps: int, deepest: int = REST_DEEPEST) -> int:
    """The plans in a rest's first `steps` steps: REST_EVERY steps in, then twice as many
    steps later each time, up to `deepest` apart (REST_DEEPEST: a ledger far from paying; 4,
    12, 28, 60, 124, ...)."""
    count, gap, at = 0, REST_EVERY, REST_EVERY
    while at <= steps:
        count, gap = count + 1, min(deepest, 2 * gap)
        at += gap
    return count


def test_after_rest_after_idle_plans_only_one_step_in_rest_every_plans():
    policy, requests = CountingPolicy(), caught_up_requests()
    driver = driver_with(policy)
    assert plans(driver, requests, REST_AFTER) == [{}] * REST_AFTER
    assert policy.calls == REST_AFTER  # every step while not yet idle for REST_AFTER plans
    steps = 15 * REST_EVERY
    assert plans(driver, requests, steps) == [{}] * steps
    resting = resting_plans(steps, REST_NEAR)  # idle plans, no ledger yet: not far from paying
    assert resting == 5  # at steps 4, 12, 28, 44, 60 of the rest
    assert policy.calls == REST_AFTER + resting  # the other steps rested: no offers, no plan
    assert policy.rested == steps - resting  # and the policy was told (its exploration clock)
    assert driver.last_chosen_k == () and driver.last_plan_time >= 0.0
    # the driver's own counts, as benchmarks/spec_bench.py reports them
    assert driver.num_rested == steps - resting
    assert driver.num_plans == REST_AFTER + resting and driver.num_drafting_plans == 0


def test_fewer_than_rest_from_requests_do_not_rest_on_idle_plans_alone():
    assert REST_FROM == 3
    policy, requests = CountingPolicy(), caught_up_requests(REST_FROM - 1)
    driver = driver_with(policy)
    steps = REST_AFTER + 4 * REST_DEEPEST  # idle plans that would rest REST_FROM requests
    for running in (requests[:1], requests):
        assert plans(driver, running, steps) == [{}] * steps
    assert policy.calls == 2 * steps and policy.rested == 0 and driver.num_rested == 0
    # REST_FROM requests rest: REST_AFTER idle plans, then REST_EVERY - 1 rested steps
    driver = driver_with(CountingPolicy())
    plans(driver, caught_up_requests(REST_FROM), REST_AFTER + REST_EVERY)
    assert driver.num_rested == REST_EVERY - 1


def test_a_plan_that_drafts_ends_the_rest():
    policy, requests = CountingPolicy(), caught_up_requests()
    driver = driver_with(policy)
    plans(driver, requests, REST_AFTER + REST_EVERY)
    before = policy.calls
    assert before == REST_AFTER + 1  # resting
    policy.answer = {requests[0].request_id: 2}
    planned = plans(driver, requests, 3 * REST_EVERY)
    # The next planning step (twice REST_EVERY after the first) drafts; from then on every
    # step plans again.
    first = next(i for i, plan in enumerate(planned) if plan)
    assert first == 2 * REST_EVERY - 1 and all(planned[first:])
    assert policy.calls == before + 1 + (3 * REST_EVERY - first - 1)
    assert driver.num_drafting_plans == 3 * REST_EVERY - first
    # A later rest starts again REST_EVERY steps apart.
    policy.answer = {}
    plans(driver, requests, REST_AFTER)
    assert [bool(p) for p in plans(driver, requests, REST_EVERY)] == [False] * REST_EVERY
    assert policy.calls == before + 1 + (3 * REST_EVERY - first - 1) + REST_AFTER + 1


def test_each_batch_class_rests_on_its_own_ledger():
    """Four requests rest after REST_AFTER idle plans; one request alone starts its own rest
    (planning every step), and the four's rest is still there when they come back."""
    policy = CountingPolicy()
    driver = driver_with(policy)
    four, one = caught_up_requests(4), caught_up_requests(1)
    plans(driver, four, REST_AFTER + REST_EVERY)
    assert policy.calls == REST_AFTER + 1  # resting
    before = policy.calls
    plans(driver, one, REST_EVERY)
    assert policy.calls == before + REST_EVERY  # a batch of one: a plan every step
    before = policy.calls
    plans(driver, four, 2 * REST_EVERY)
    assert policy.calls == before + 1  # the four's rest went on: its next plan 8 steps on
    assert [batch_class(n) for n in (0, 1, 2, 3, 4, 7, 8, 16, 64)] == [1, 1, 2, 2, 3, 3, 4, 5, 7]


def test_fixed_policies_plan_every_step():
    policy, requests = FixedPolicy(0), caught_up_requests()
    calls = []
    plan = policy.plan
    policy.plan = lambda candidates, base: calls.append(1) or plan(candidates, base)
    driver = driver_with(policy)
    steps = REST_AFTER + 3 * REST_EVERY
    assert plans(driver, requests, steps) == [{}] * steps
    assert len(calls) == steps and not policy.rests


def tended(runs: list[int]) -> int:
    """The tended steps of these runs of rested steps: the first of each and one in
    REST_SEEN_EVERY after it."""
    return sum(-(-run // REST_SEEN_EVERY) for run in runs)


def test_while_resting_shadow_checks_start_on_the_tended_steps():
    """Planning, the checks start every step; resting, on the first rested step after a plan
    and one in REST_SEEN_EVERY after it (a check's outcome may wake the rest: below)."""
    assert REST_SEEN_EVERY == 4
    shadows, requests = CountingShadows(), caught_up_requests()
    driver = driver_with(CountingPolicy(), shadows)
    steps = REST_AFTER + 200
    runs, run = [], 0
    for _ in range(steps):
        driver.plan(requests)
        run = run + 1 if driver.rested else (runs.append(run) or 0)
        driver.propose(SchedulerOutput(scheduled=()))
    runs.append(run)
    assert max(runs) >= 2 * REST_SEEN_EVERY  # deep rests: a tended step in every four
    assert shadows.starts == driver.num_plans + tended(runs) < steps


class FoundShadows(CountingShadows):
    """Every check it is asked about found a chain of `found` drafts the target went on to
    emit (as the shadow checks of a request that started copying)."""

    def __init__(self, found: int) -> None:
        super().__init__()
        self.found, self.checks = found, 0

    def check(self, request):
        self.checks += 1
        spec = request.spec
        return [SpecResult(request.request_id, 4, self.found, spec=spec, shadow=True)]


@pytest.mark.parametrize("found", [WAKE_ACCEPTED - 1, WAKE_ACCEPTED])
def test_a_shadow_chain_that_would_have_paid_wakes_the_rest(found):
    """Deep in a rest (plans REST_DEEPEST steps apart), a rested step whose shadow check
    would have had WAKE_ACCEPTED drafts accepted makes the next step plan; one short of it
    does not."""
    policy, requests = CountingPolicy(), caught_up_requests()
    driver = driver_with(policy, FoundShadows(found))
    plans(driver, requests, REST_AFTER + 200)  # resting, its plans far apart by now
    driver.plan(requests)
    while not driver.rested:
        driver.plan(requests)
    calls = policy.calls
    requests[0].spec.shadows = {"": "an open check"}
    observe_step(driver, requests, None, 0.004)
    requests[0].spec.shadows = {}
    driver.plan(requests)
    assert (policy.calls == calls + 1) == (found >= WAKE_ACCEPTED)


def ledger_steps(rest: PlanningRest, accepted: int, emitted: int, plan_s: float, step_s: float):
    for _ in range(REST_AFTER):
        rest.planned(accepted > 0)
        rest.observed(accepted, emitted, plan_s, step_s)


def skipped(rest: PlanningRest, steps: int) -> int:
    return sum(rest.skips() for _ in range(steps))


def test_the_ledger_pays_until_it_is_full_then_compares_token_and_time_shares():
    rest = PlanningRest()
    for _ in range(REST_AFTER - 1):  # drafts nothing accepted, planning 10% of the time
        rest.planned(True)
        rest.observed(0, 16, 0.01, 0.1)
    assert rest.pays() and skipped(rest, 3 * REST_EVERY) == 0
    rest.observed(0, 16, 0.01, 0.1)
    assert not rest.pays()
    # 2 accepted of 18 emitted: 2/16 = 12.5% more tokens against 10% of the time: pays.
    ledger_steps(rest, 2, 18, 0.01, 0.1)
    assert rest.pays() and skipped(rest, 3 * REST_EVERY) == 0
    # 1 accepted of 17: 1/16 = 6.25% against 10%: rests.
    ledger_steps(rest, 1, 17, 0.01, 0.1)
    assert not rest.pays()
    assert skipped(rest, 15 * REST_EVERY) == 15 * REST_EVERY - resting_plans(15 * REST_EVERY)


def test_a_rest_far_from_paying_doubles_the_steps_between_its_plans_up_to_rest_deepest():
    """While each plan finds drafts still not paying, the steps to the next plan double:
    at four SmolLM2 chat requests, where drafts never paid, a plan one step in four cost
    ~3% of the steps' time (docs/benchmarks.md §5ze); near saturation, plans up to 64 apart
    halved the plans (§5zj)."""
    rest = PlanningRest()
    ledger_steps(rest, 0, 16, 0.01, 0.1)
    assert rest.far()
    planned = [i + 1 for i in range(256) if not rest.skips()]
    assert planned == [4, 12, 28, 60, 124, 188, 252]
    assert REST_EVERY == 4 and REST_DEEPEST == 64


def test_a_rest_near_paying_plans_at_least_every_rest_near_steps():
    """16 SmolLM2 requests copying, whose resting ledger returned a median 0.94 of its cost,
    ran 1.07x off with plans up to 16 steps apart and 1.02x with 64 (docs/benchmarks.md
    §5zj)."""
    rest = PlanningRest()
    ledger_steps(rest, 1, 12, 0.01, 0.1)  # 1/12 more tokens for 10% more time: 0.83 of it
    assert not rest.pays() and not rest.far() and REST_FAR < 0.83
    planned = [i + 1 for i in range(128) if not rest.skips()]
    assert planned == [4, 12, 28, 44, 60, 76, 92, 108, 124]
    assert REST_NEAR == 16


def test_a_planning_step_that_pays_again_ends_the_ledger_rest():
    rest = PlanningRest()
    ledger_steps(rest, 1, 65, 0.004, 0.1)  # 1/64 = 1.6% against 4%
    assert skipped(rest, REST_EVERY) == REST_EVERY - 1
    # Copy begins: 6 accepted of 70 a step; half the window: 56 / 1024 = 5.5% against 4%.
    for _ in range(REST_AFTER // 2):
        rest.planned(True)
        rest.observed(6, 70, 0.004, 0.1)
    assert rest.pays() and skipped(rest, 2 * REST_EVERY) == 0


def copy_then_write(rest: PlanningRest, spans: int) -> None:
    """Code editing at one request: a copied span (8 planning steps accepting 6 drafts each of
    a 20 ms step) and then REST_AFTER steps of new text where nothing is offered (idle plans,
    0.1 ms of planning each), `spans` times."""
    for _ in range(spans):
        for _ in range(8):
            rest.planned(True)
            rest.observed(6, 7, 0.0002, 0.025, drafts=6, excess_seconds=0.005)
        for _ in range(REST_AFTER):
            rest.planned(False)
            rest.observed(0, 1, 0.0001, 0.02)


def test_no_rest_between_runs_of_accepted_drafts_while_the_long_ledger_pays():
    """After a copied span, REST_AFTER idle plans rest on the short ledger alone; the long
    ledger, holding the span too, says speculation paid: no rest, so the next span is drafted
    on its first step. A ledger of idle plans alone (no more than the short one) rests."""
    assert REST_HORIZON == 256
    rest = PlanningRest()
    copy_then_write(rest, 1)
    assert not rest.pays() and rest.paid_long()
    assert skipped(rest, 4 * REST_DEEPEST) == 0
    idle = PlanningRest()
    ledger_steps(idle, 0, 1, 0.0001, 0.02)
    assert not idle.pays() and not idle.paid_long()
    assert skipped(idle, REST_EVERY) == REST_EVERY - 1


def test_where_planning_costs_a_share_of_the_step_the_short_ledger_rests_alone():
    """SmolLM2 at one request: plans of 0.2 ms on 3.3 ms steps (6%). Speculation paid over the
    long ledger, not over the short one: a rest saves 6% of the steps, so it rests."""
    assert REST_MIN_SHARE == 0.015
    rest = PlanningRest()
    for _ in range(8):
        rest.planned(True)
        rest.observed(6, 7, 0.0002, 0.005, drafts=6, excess_seconds=0.001)
    ledger_steps(rest, 0, 1, 0.0002, 0.0033)
    assert not rest.pays() and not rest.paid_long()
    assert skipped(rest, REST_EVERY) == REST_EVERY - 1


def test_the_long_ledger_rests_where_drafts_never_paid():
    """Chat under load: every planning step's drafts rejected, over the whole horizon."""
    rest = PlanningRest()
    for _ in range(REST_HORIZON):
        rest.planned(True)
        rest.observed(0, 16, 0.001, 0.02, drafts=4, excess_seconds=0.002)
    assert not rest.pays() and not rest.paid_long()
    assert skipped(rest, 4 * REST_DEEPEST) == 4 * REST_DEEPEST - resting_plans(4 * REST_DEEPEST)


def test_the_long_verdict_is_reread_every_rest_after_entries():
    rest = PlanningRest()
    copy_then_write(rest, 2)
    assert rest.paid_long()
    for _ in range(REST_AFTER - 1):  # drafts that lose, not yet re-read
        rest.observed(0, 16, 0.01, 0.02, drafts=8, excess_seconds=0.02)
    assert rest.paid_long()
    for _ in range(REST_HORIZON - REST_AFTER + 1):
        rest.observed(0, 16, 0.01, 0.02, drafts=8, excess_seconds=0.02)
    assert not rest.paid_long()


def observe_step(driver: SpecDriver, requests, accepted: int | None, step_s: float) -> None:
    """One decode step of every request, the first one's k = 2 chain accepting `accepted`
    (None: no drafts, no outcome)."""
    scheduled = tuple(ScheduledRequest(r, 1, 0, r.num_computed_tokens) for r in requests)
    outputs = {r.request_id: RequestStepOutput(r.request_id, (7,)) for r in requests}
    if accepted is not None:
        first = requests[0].request_id
        outputs[first] = RequestStepOutput(first, (7,) * (accepted + 1), 2, accepted)
    out = ModelOutput(outputs, step_time=step_s)
    driver.observe(SchedulerOutput(scheduled), Drafts(), out)


def test_the_driver_rests_where_accepted_drafts_do_not_pay_for_planning():
    for accepted, rests in ((0, True), (2, False)):
        policy, requests = CountingPolicy(), caught_up_requests(4)
        policy.answer = {requests[0].request_id: 2}  # drafts every plan: no idle plans
        driver = driver_with(policy)
        for _ in range(REST_AFTER):
            driver.plan(requests)
            driver.last_plan_time = 0.01  # planning 10% of every step's time
            observe_step(driver, requests, accepted, 0.09)
        before = policy.calls
        plans(driver, requests, 4 * REST_EVERY)
        # 0 accepted rests; 2 of 6 emitted (2/4 = 50%) pays.
        assert policy.calls - before == (resting_plans(4 * REST_EVERY) if rests else 4 * REST_EVERY)


def test_drafts_whose_measured_extra_time_outweighs_their_tokens_rest():
    """2 accepted of 18 emitted against 1% of the time planning pays while drafts count as
    free; 4 drafts a step measured 30 ms over the step predicted without them (of 100 ms) do
    not: 32 accepted x 1.6 s < 288 emitted x (0.016 + 0.48) s."""
    rest = PlanningRest()
    for _ in range(REST_AFTER):
        rest.planned(True)
        rest.observed(2, 18, 0.001, 0.1, drafts=4, excess_seconds=0.0)
    assert rest.pays()
    for _ in range(REST_AFTER):
        rest.observed(2, 18, 0.001, 0.1, drafts=4, excess_seconds=0.03)
    assert not rest.pays()
    assert skipped(rest, 2 * REST_EVERY) == 2 * REST_EVERY - resting_plans(2 * REST_EVERY)


def test_the_cost_models_own_bias_on_steps_without_drafts_is_not_charged_to_drafts():
    """Every step 30 ms over the model's prediction, drafting or not: the drafts added
    nothing, and the ledger pays as with free drafts."""
    rest = PlanningRest()
    for i in range(REST_AFTER):
        drafts = 4 if i % 2 else 0
        rest.observed(2 if drafts else 0, 18 if drafts else 16, 0.001, 0.1, drafts, 0.03)
    assert rest.pays()
    for i in range(REST_AFTER):  # the drafting steps now 20 ms over the others
        drafts = 4 if i % 2 else 0
        rest.observed(
            2 if drafts else 0,
            18 if drafts else 16,
            0.001,
            0.1,
            drafts,
            0.03 + (0.02 if drafts else 0),
        )
    assert not rest.pays()


def test_a_prefill_the_model_overpriced_does_not_charge_its_error_to_the_drafts():
    """SmolLM2 copying (§5zd): fifteen 8.9 ms steps that accepted 8 of 8 drafts, 5.5 ms over
    the model's 3.3 ms without them, and one new request's 130 ms prefill 13 ms under its
    prediction. The model's bias is relative (-9% there): an absolute one added 13 ms to each
    drafting step and the ledger rested copy."""
    rest = PlanningRest()
    for _ in range(REST_AFTER - 1):
        rest.observed(8, 9, 0.0001, 0.0089, drafts=8, excess_seconds=0.0055)
    rest.observed(0, 1, 0.0, 0.130, drafts=0, excess_seconds=-0.013)
    assert rest.pays()
    # The same steps whose drafts were all rejected do not.
    for _ in range(REST_AFTER - 1):
        rest.observed(0, 1, 0.0001, 0.0089, drafts=8, excess_seconds=0.0055)
    rest.observed(0, 1, 0.0, 0.130, drafts=0, excess_seconds=-0.013)
    assert not rest.pays()


class LinearSteps:
    """A fitted cost model: 10 ms a batched row."""

    fitted = True

    def predict(self, features) -> float:
        return 0.01 * features.num_batched_tokens

    def observe(self, features, seconds) -> None:
        pass


def verify_first(driver: SpecDriver, requests, drafts: int, accepted: int, step_s=0.01) -> None:
    """One step: the first request verifies a chain of `drafts` with `accepted` accepted, the
    others decode one token each."""
    first = requests[0].request_id
    scheduled = tuple(
        ScheduledRequest(r, 1 + drafts, drafts, r.num_computed_tokens)
        if r.request_id == first
        else ScheduledRequest(r, 1, 0, r.num_computed_tokens)
        for r in requests
    )
    outputs = {r.request_id: RequestStepOutput(r.request_id, (7,)) for r in requests}
    outputs[first] = RequestStepOutput(first, (7,) * (accepted + 1), drafts, accepted)
    chain = Drafts(chains={first: list(range(5, 5 + drafts))})
    driver.observe(SchedulerOutput(scheduled), chain, ModelOutput(outputs, step_time=step_s))


def test_the_driver_charges_drafts_their_measured_seconds_over_the_plain_prediction():
    """Four requests, the first verifying a chain of 2 that gets 1 accepted: 40 ms predicted
    without the drafts. Measured at 60 ms (the drafts cost their rows) the chain's one token
    is worth 60 / 5 = 12 ms, less than the 20 ms it added: the driver rests; measured at 42 ms
    it pays."""
    for step_s, rests in ((0.060, True), (0.042, False)):
        policy, requests = CountingPolicy(), caught_up_requests(4)
        policy.answer = {requests[0].request_id: 2}
        config = SpecConfig(proposer="ngram", spec_policy="goodput")
        driver = SpecDriver(config, NoOffers(), policy, LinearSteps(), None, 64)
        for _ in range(REST_AFTER):
            driver.plan(requests)
            driver.last_plan_time = 0.0
            verify_first(driver, requests, 2, 1, step_s)
        before = policy.calls
        plans(driver, requests, 4 * REST_EVERY)
        assert policy.calls - before == (resting_plans(4 * REST_EVERY) if rests else 4 * REST_EVERY)


def test_a_policy_set_on_the_driver_brings_its_own_rest():
    """Swapping the policy (as tests and tools do) starts a fresh rest for a resting policy
    and none for one that does not rest (a stand-in without `rests` plans every step)."""
    driver = driver_with(CountingPolicy())
    resting = driver.rest
    assert resting is not None
    driver.policy = FixedPolicy(1)
    assert driver.rest is None
    driver.policy = CountingPolicy()
    assert driver.rest is not None and driver.rest is not resting

    class Bare:  # no `rests`, no `rest_step`
        def plan(self, candidates, base):
            return {}

    driver.policy = Bare()
    assert driver.rest is None
    requests = caught_up_requests()
    assert plans(driver, requests, REST_AFTER + 2 * REST_EVERY) == [{}] * (
        REST_AFTER + 2 * REST_EVERY
    )


def test_chains_pass_the_short_length_only_while_drafts_pay_and_up_to_twice_a_whole_one():
    rest = PlanningRest()
    assert rest.pays()
    assert [rest.chain_cap(8, whole) for whole in (0, 2, 3, 4, 8)] == [4, 4, 6, 8, 8]
    assert rest.chain_cap(3, 8) == 3 and rest.chain_cap(SHORT_CHAIN, 0) == SHORT_CHAIN
    ledger_steps(rest, 0, 16, 0.01, 0.1)  # drafts that do not pay
    assert not rest.pays() and rest.chain_cap(8, 8) == SHORT_CHAIN


def test_the_driver_caps_each_chain_by_the_requests_last_whole_chain():
    """Four drafts all accepted lift the first request's cap to 8; three of four put it back
    to 4; the others stay at 4. Fixed policies keep the engine's cap."""
    policy, requests = CountingPolicy(), caught_up_requests(2)
    driver = driver_with(policy)
    first, second = (r.request_id for r in requests)
    driver.plan(requests)
    assert policy.caps == {first: 4, second: 4}
    verify_first(driver, requests, 4, 4)
    driver.plan(requests)
    assert policy.caps == {first: 8, second: 4}
    verify_first(driver, requests, 4, 3)
    driver.plan(requests)
    assert policy.caps == {first: 4, second: 4}
    driver.policy = FixedPolicy(8)
    assert driver.rest is None
    assert driver.plan(requests) == {first: 8, second: 8}


def test_one_request_rests_once_the_long_ledger_says_drafts_did_not_pay():
    """SmolLM2 chat alone: plans 2-4% of a step, drafts rarely accepted over hundreds of steps.
    Never resting, one request ran 1.026-1.035x off; resting on the long ledger 1.007-1.008x
    (docs/benchmarks.md §5zo). Each planning step drafts 2 and none is accepted, planning 5%
    of a 4 ms step: the first REST_FEW_AFTER plan, then the rest begins."""
    assert REST_FEW_AFTER == 64
    policy, one = CountingPolicy(), caught_up_requests(1)
    policy.answer = {one[0].request_id: 2}
    driver = driver_with(policy)
    rested = []
    for _ in range(REST_FEW_AFTER + REST_AFTER):
        driver.plan(one)
        rested.append(driver.rested)
        if driver.rested:
            observe_step(driver, one, None, 0.0038)
        else:
            driver.last_plan_time = 0.0002
            observe_step(driver, one, 0, 0.0038)
    assert not any(rested[:REST_FEW_AFTER]) and rested[REST_FEW_AFTER]
    assert driver.rest.unpaid_long() and not driver.rest.pays()
    assert sum(rested) == driver.num_rested == REST_AFTER - resting_plans(REST_AFTER)


def test_few_requests_do_not_rest_between_copied_spans_where_planning_is_dear():
    """Where planning is over REST_MIN_SHARE of a step, REST_FROM requests rest between two
    copied spans on the short ledger (paid_long does not hold); one and two requests do not,
    since the long ledger says speculation paid: resting between spans ran SmolLM2 code
    editing alone 0.921x off against 0.907x (docs/benchmarks.md §5zn)."""
    many, few = PlanningRest(), PlanningRest()
    for rest in (many, few):
        for _ in range(4):
            for _ in range(8):
                rest.planned(True)
                rest.observed(6, 7, 0.0002, 0.005, drafts=6, excess_seconds=0.001)
            ledger_steps(rest, 0, 1, 0.0002, 0.0033)
        assert not rest.pays() and not rest.paid_long() and not rest.unpaid_long()
    assert skipped(many, REST_EVERY) == REST_EVERY - 1
    assert sum(few.skips(few=True) for _ in range(4 * REST_DEEPEST)) == 0


@pytest.mark.parametrize("learns", [False, True])
def test_a_rested_step_is_tended_one_in_rest_seen_every(learns):
    """Resting, the driver tends (checks the shadows, feeds the policy and its cost model)
    every planning step, the first rested step after a plan and one in REST_SEEN_EVERY after
    it; the others only count their tokens (the step's goodput). A proposer that learns from
    every step (Token Recycling) is still shown every step."""
    assert REST_SEEN_EVERY == 4
    policy, requests, shadows = CountingPolicy(), caught_up_requests(), FoundShadows(0)
    driver = driver_with(policy, shadows)
    driver.learns = learns
    shown = []
    driver.proposer.observe = shown.append
    for _ in range(REST_AFTER):
        driver.plan(requests)
        observe_step(driver, requests, None, 0.004)
    assert policy.observed == REST_AFTER
    runs, run, goodputs = [], 0, set()
    for _ in range(128):
        driver.plan(requests)
        requests[0].spec.shadows = {"": "an open check"}
        observe_step(driver, requests, None, 0.004)
        if driver.rested:
            goodputs.add(driver.last_goodput)
        run = run + 1 if driver.rested else (runs.append(run) or 0)
    runs.append(run)
    assert driver.num_rested == 128 - resting_plans(128) == sum(runs)
    assert max(runs) >= 2 * REST_SEEN_EVERY
    planned = 128 - sum(runs)
    assert policy.observed == REST_AFTER + planned + tended(runs) < REST_AFTER + 128
    assert shadows.checks == planned + tended(runs)
    assert goodputs == {len(requests) / 0.004}  # every rested step's tokens counted
    assert len(shown) == (REST_AFTER + 128 if learns else 0)


def test_a_rested_step_returns_before_proposing_and_takes_no_proposer_time():
    """Without a draft model to warm, a rested step has nothing to propose: it returns its
    empty drafts at once (the proposer's target top-k still asked for), not timed."""
    driver = driver_with(CountingPolicy())
    requests = caught_up_requests()
    plans(driver, requests, REST_AFTER + 1)
    assert driver.rested
    scheduled = tuple(ScheduledRequest(r, 1, 0, r.num_computed_tokens) for r in requests)
    drafts = driver.propose(SchedulerOutput(scheduled))
    assert drafts.chains == {} and drafts.trees == {} and drafts.proposer_time == 0.0
    assert drafts.target_topk == NoOffers.target_topk
