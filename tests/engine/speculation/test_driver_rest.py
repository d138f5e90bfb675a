"""SpecDriver rests: a policy that prices drafts (goodput) and has drafted nothing for
REST_AFTER plans is asked for a plan on one step in REST_EVERY; a plan that drafts ends the
rest; fixed:k never rests. Pure Python: stub policy and proposer, factory requests."""

from __future__ import annotations

from engine.config import SpecConfig
from engine.outputs import SchedulerOutput
from engine.request import RequestStatus
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.policy import FixedPolicy, SpecPolicy
from engine.speculation.driver import REST_AFTER, REST_EVERY, SpecDriver
from tests.engine.factories import make_requests


class CountingPolicy(SpecPolicy):
    """Plans `answer`; counts its plans."""

    rests = True

    def __init__(self) -> None:
        self.answer: dict[str, int] = {}
        self.calls = 0

    def plan(self, candidates, base):
        self.calls += 1
        return dict(self.answer)


class NoOffers:
    """A proposer that cannot say before the plan what it would draft (no `offer`)."""

    name = "ngram"
    target_topk = 0


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


def caught_up_requests(count: int = 2):
    requests = make_requests(count)
    for request in requests:
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = request.num_tokens - 1
    return requests


def plans(driver: SpecDriver, requests, steps: int) -> list[dict[str, int]]:
    return [driver.plan(requests) for _ in range(steps)]


def test_after_rest_after_idle_plans_only_one_step_in_rest_every_plans():
    policy, requests = CountingPolicy(), caught_up_requests()
    driver = driver_with(policy)
    assert plans(driver, requests, REST_AFTER) == [{}] * REST_AFTER
    assert policy.calls == REST_AFTER  # every step while not yet idle for REST_AFTER plans
    steps = 5 * REST_EVERY
    assert plans(driver, requests, steps) == [{}] * steps
    assert policy.calls == REST_AFTER + 5  # the other steps rested: no offers, no plan
    assert driver.last_chosen_k == () and driver.last_plan_time >= 0.0


def test_a_plan_that_drafts_ends_the_rest():
    policy, requests = CountingPolicy(), caught_up_requests()
    driver = driver_with(policy)
    plans(driver, requests, REST_AFTER + REST_EVERY)
    before = policy.calls
    assert before == REST_AFTER + 1  # resting
    policy.answer = {requests[0].request_id: 2}
    planned = plans(driver, requests, 2 * REST_EVERY)
    # The next planning step drafts; from then on every step plans again.
    first = next(i for i, plan in enumerate(planned) if plan)
    assert first < REST_EVERY and all(planned[first:])
    assert policy.calls == before + 1 + (2 * REST_EVERY - first - 1)


def test_fixed_policies_plan_every_step():
    policy, requests = FixedPolicy(0), caught_up_requests()
    calls = []
    plan = policy.plan
    policy.plan = lambda candidates, base: calls.append(1) or plan(candidates, base)
    driver = driver_with(policy)
    steps = REST_AFTER + 3 * REST_EVERY
    assert plans(driver, requests, steps) == [{}] * steps
    assert len(calls) == steps and not policy.rests


def test_while_resting_shadow_checks_start_only_on_the_planning_steps():
    shadows, requests = CountingShadows(), caught_up_requests()
    driver = driver_with(CountingPolicy(), shadows)
    steps = REST_AFTER + 4 * REST_EVERY
    for _ in range(steps):
        driver.plan(requests)
        driver.propose(SchedulerOutput(scheduled=()))
    assert shadows.starts == REST_AFTER + 4
