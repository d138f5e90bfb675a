"""Goodput policy: acceptance estimates, the greedy k search, exploration, trees."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.request import SpecState
from engine.speculation.control.acceptance import (
    AcceptanceEstimator,
    expected_emitted,
    tree_acceptance,
    tree_gains,
)
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.held_prices import REPRICE_EVERY
from engine.speculation.control.policy import SpecCandidate, SpecResult
from engine.speculation.control.search import SearchProblem, SearchSlot, best_lengths
from engine.speculation.control.step_features import StepFeatures
from kernels.graph_shapes import NO_GRAPHS, GraphShapes
from tests.engine.factories import request_state_in

DECODE_GRAPHS = GraphShapes((1, 2, 4, 8), 1)  # decode steps replayed, verification eager
VERIFY_GRAPHS = GraphShapes((1, 2, 4, 8), 5)  # chains of up to 4 drafts replayed too


class LinearCost:
    """A synthetic step-time model: intercept + per batched token + fixed costs per draft
    step (draft-model pass), per speculating request and per eager step."""

    def __init__(
        self,
        intercept: float,
        per_token: float,
        per_draft_step: float = 0.0,
        per_spec_request: float = 0.0,
        per_eager_step: float = 0.0,
    ) -> None:
        self.intercept, self.per_token, self.per_draft_step = intercept, per_token, per_draft_step
        self.per_spec_request, self.per_eager_step = per_spec_request, per_eager_step
        self.num_observations = 0
        self.observed: list[tuple[StepFeatures, float]] = []

    def predict(self, f: StepFeatures) -> float:
        fixed = self.per_draft_step * f.num_draft_steps + self.per_eager_step * f.num_eager_steps
        fixed += self.per_spec_request * f.num_spec_requests
        return self.intercept + self.per_token * f.num_batched_tokens + fixed

    def observe(self, f: StepFeatures, seconds: float) -> None:
        self.observed.append((f, seconds))
        self.num_observations += 1

    @property
    def fitted(self) -> bool:
        return True

    def accuracy(self) -> float | None:
        return None


def decode_base(num_requests: int, context_len: int = 200) -> StepFeatures:
    return StepFeatures.from_shapes([(context_len, 1, 0)] * num_requests)


# Each test's requests' speculation records (SpecState), by request id: what a policy learns
# about a request lives on its record, as it does on an engine Request.
RECORDS: dict[str, SpecState] = {}


@pytest.fixture(autouse=True)
def fresh_records():
    RECORDS.clear()


def spec(request_id: str) -> SpecState:
    return RECORDS.setdefault(request_id, SpecState())


def result(request_id: str, num_draft_tokens: int, num_accepted: int, proposer: str = ""):
    return SpecResult(request_id, num_draft_tokens, num_accepted, proposer, spec=spec(request_id))


def teach(policy: GoodputPolicy, request_id: str, acceptance: float, rounds: int = 30) -> None:
    """Feed results as if every chain of 4 accepted a fraction `acceptance` per position."""
    rng = random.Random(request_id)
    for _ in range(rounds):
        accepted = 0
        while accepted < 4 and rng.random() < acceptance:
            accepted += 1
        policy.acceptance.update(result(request_id, 4, accepted))


def candidate(request_id: str, max_draft_tokens: int = 8) -> SpecCandidate:
    return SpecCandidate(request_id, 200, max_draft_tokens, spec(request_id))


def candidates(*request_ids: str, max_draft_tokens: int = 8) -> list[SpecCandidate]:
    return [candidate(request_id, max_draft_tokens) for request_id in request_ids]


def test_expected_emitted_matches_the_sum_of_prefix_probabilities():
    for a in (0.0, 0.3, 0.9, 1.0):
        for k in range(6):
            assert expected_emitted(a, k) == pytest.approx(sum(a**j for j in range(k + 1)))


def test_no_speculation_when_verify_cost_grows_steeply():
    policy = GoodputPolicy(
        LinearCost(intercept=0.001, per_token=0.05), max_draft_tokens=8, prior=0.9
    )
    assert policy.plan(candidates("a", "b", "c"), decode_base(3)) == {}
    assert policy.last_predicted_step_time == pytest.approx(0.001 + 0.05 * 3)


def test_long_chains_when_steps_are_overhead_bound_and_acceptance_high():
    policy = GoodputPolicy(
        LinearCost(intercept=0.02, per_token=1e-5), max_draft_tokens=8, prior=0.9
    )
    teach(policy, "a", 0.95)
    plan = policy.plan(candidates("a"), decode_base(1))
    assert plan == {"a": 8}
    assert policy.last_predicted_step_time == pytest.approx(0.02 + 9e-5)


def test_requests_of_different_acceptance_get_different_k_in_one_batch():
    policy = GoodputPolicy(LinearCost(intercept=0.01, per_token=2e-3), max_draft_tokens=8)
    teach(policy, "good", 0.9)
    teach(policy, "poor", 0.15)
    plan = policy.plan(candidates("good", "poor"), decode_base(2))
    assert plan.get("good", 0) >= 3
    assert plan.get("good", 0) > plan.get("poor", 0)
    assert policy.rate(spec("good")) > 0.75 and policy.rate(spec("poor")) < 0.3


def test_k_respects_each_request_cap_and_the_token_budget():
    cost = LinearCost(intercept=0.02, per_token=1e-5)
    policy = GoodputPolicy(cost, max_draft_tokens=8, prior=0.9)
    capped = [candidate("a", 2), candidate("b", 0), candidate("c", 9)]
    assert policy.plan(capped, decode_base(3)) == {"a": 2, "c": 8}
    budgeted = GoodputPolicy(cost, max_draft_tokens=8, prior=0.9, token_budget=3 + 5)
    assert sum(budgeted.plan(candidates("a", "b", "c"), decode_base(3)).values()) == 5


def brute_force(rates, cost, cap: int, draft_model: bool, graphs: GraphShapes) -> float:
    base = decode_base(len(rates))
    best = 0.0
    for ks in itertools.product(range(cap + 1), repeat=len(rates)):
        passes = max(ks) if draft_model else 0
        f = base.with_drafts(sum(ks), sum(k > 0 for k in ks), passes, graphs)
        emitted = sum(expected_emitted(a, k) for a, k in zip(rates, ks, strict=True))
        best = max(best, emitted / cost.predict(f))
    return best


def search(rates, cost, cap: int, draft_model: bool, graphs: GraphShapes = NO_GRAPHS):
    slots = [SearchSlot([a**j for j in range(1, cap + 1)], range(1, cap + 1), cap) for a in rates]
    problem = SearchProblem(slots, decode_base(len(rates)), cost, draft_model, graphs)
    return best_lengths(problem)


@pytest.mark.parametrize("draft_model", [False, True])
def test_search_reaches_the_brute_force_optimum_with_fixed_costs(draft_model):
    rng = random.Random(int(draft_model))
    for _ in range(60):
        rates = [rng.random() for _ in range(rng.randint(1, 4))]
        cost = LinearCost(
            rng.uniform(0.005, 0.03),
            rng.uniform(1e-4, 5e-3),
            per_draft_step=rng.choice([0.0, rng.uniform(0, 0.02)]),
            per_spec_request=rng.choice([0.0, rng.uniform(0, 0.02)]),
            per_eager_step=rng.choice([0.0, rng.uniform(0, 0.03)]),
        )
        graphs = DECODE_GRAPHS if rng.random() < 0.5 else NO_GRAPHS
        best = brute_force(rates, cost, 4, draft_model, graphs)
        assert search(rates, cost, 4, draft_model, graphs).goodput >= 0.99 * best


class HingeCost(LinearCost):
    """LinearCost plus a steeper per-token cost past `knot` batched tokens: convex, like the
    online model's nonnegative row ramps."""

    def __init__(self, knot: int, extra: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.knot, self.extra = knot, extra

    def predict(self, f: StepFeatures) -> float:
        hinge = self.extra * max(0, f.num_batched_tokens - self.knot)
        return super().predict(f) + hinge


def random_hinge_cost(rng: random.Random) -> HingeCost:
    return HingeCost(
        knot=rng.randint(1, 8),
        extra=rng.uniform(0, 5e-3),
        intercept=rng.uniform(0.005, 0.03),
        per_token=rng.uniform(1e-4, 5e-3),
        per_spec_request=rng.choice([0.0, rng.uniform(0, 0.02)]),
    )


def test_the_no_speculation_shortcut_only_fires_at_the_optimum():
    """Low acceptance under load: the search answers "no drafts" in one pass when no plan
    beats it (search._floors_are_best), and that answer is brute force's, hinge included."""
    rng = random.Random(5)
    fired = 0
    for _ in range(80):
        rates = [rng.uniform(0.0, 0.6) for _ in range(rng.randint(1, 4))]
        cost = random_hinge_cost(rng)
        best = brute_force(rates, cost, 4, False, NO_GRAPHS)
        result = search(rates, cost, 4, False)
        assert result.goodput >= 0.99 * best
        if all(k == 0 for k in result.ks):  # "no drafts" is only ever the exact optimum
            assert result.goodput >= (1 - 1e-12) * best
            fired += 1
    assert 10 < fired < 70  # both answers occur


def test_one_request_stops_early_only_when_no_longer_chain_can_win():
    """Batch 1 stops trying longer chains once even all drafts accepted could not beat the best
    (step time never falls as k grows): the answer is every k's brute-force argmax, exactly."""
    rng = random.Random(9)
    for _ in range(200):
        rate = rng.choice([rng.uniform(0.0, 0.3), rng.uniform(0.3, 1.0)])
        cost = random_hinge_cost(rng)
        cap = rng.randint(1, 8)
        goodputs = []
        for k in range(cap + 1):
            f = decode_base(1).with_drafts(k, int(k > 0))
            goodputs.append(expected_emitted(rate, k) / cost.predict(f))
        want = max(range(cap + 1), key=lambda k: (goodputs[k], -k))
        assert search([rate], cost, cap, draft_model=False).ks == (want,)


def test_a_fixed_cost_per_speculating_request_is_paid_when_speculation_doubles_goodput():
    # The first case: base 10 ms, 10 ms per speculating request, acceptance 0.9.
    cost = LinearCost(0.01, 0.0, per_spec_request=0.01)
    result = search([0.9], cost, 4, draft_model=False)
    assert result.ks == (4,)
    assert result.goodput == pytest.approx(expected_emitted(0.9, 4) / 0.02)  # ~204 vs 100 tok/s


def test_draft_passes_are_paid_once_for_the_whole_batch():
    # The second case: 16 requests, 10 ms per draft pass, acceptance 0.8.
    cost = LinearCost(0.02, 1e-4, per_draft_step=0.01)
    result = search([0.8] * 16, cost, 4, draft_model=True)
    assert set(result.ks) == {2} or set(result.ks) == {3}
    assert result.goodput >= 0.99 * brute_force_uniform([0.8] * 16, cost, 4)


def brute_force_uniform(rates, cost, cap: int) -> float:
    """Uniform k only (16 requests are too many for a full brute force)."""
    base = decode_base(len(rates))
    return max(
        sum(expected_emitted(a, k) for a in rates)
        / cost.predict(base.with_drafts(k * len(rates), len(rates) if k else 0, k))
        for k in range(cap + 1)
    )


def test_plans_are_neither_always_max_nor_always_zero():
    """Catches a policy that always picks k = max, or never speculates, or ignores fixed
    costs: the right answer moves with acceptance and with each fixed cost."""
    cheap = LinearCost(0.02, 1e-5)
    assert search([0.95], cheap, 6, draft_model=False).ks == (6,)  # free drafts, high acceptance
    assert search([0.05], LinearCost(0.02, 5e-3), 6, draft_model=False).ks == (0,)
    middle = search([0.6], LinearCost(0.02, 2e-3), 6, draft_model=False).ks[0]
    assert 0 < middle < 6
    # The same request refuses speculation once a fixed cost outweighs what it buys ...
    assert search([0.5], LinearCost(0.01, 0.0, per_spec_request=0.02), 4, False).ks == (0,)
    # ... and pays it when acceptance is high enough.
    assert search([0.95], LinearCost(0.01, 0.0, per_spec_request=0.02), 4, False).ks == (4,)
    # An eager step (no graph) is a fixed cost too: it must be worth it for the batch.
    eager = LinearCost(0.004, 1e-5, per_eager_step=0.008)
    assert search([0.4], eager, 4, False, graphs=DECODE_GRAPHS).ks == (0,)
    assert search([0.4], eager, 4, False, graphs=NO_GRAPHS).ks[0] > 0
    # Verification on the graph path pays no eager step: the same request speculates.
    assert search([0.4], eager, 4, False, graphs=VERIFY_GRAPHS).ks[0] > 0


def test_acceptance_estimate_converges_despite_truncated_chains():
    rng = random.Random(0)
    estimator = AcceptanceEstimator(prior=0.2, decay=0.95, global_decay=0.995)
    for a, request_id in ((0.8, "high"), (0.4, "low")):
        history = []
        for _ in range(600):
            k = rng.randint(1, 3)  # short chains: accepted/drafted would read ~0.6 for a=0.8
            accepted = 0
            while accepted < k and rng.random() < a:
                accepted += 1
            estimator.update(result(request_id, k, accepted))
            history.append(estimator.rate(spec(request_id)))
        assert sum(history[-300:]) / 300 == pytest.approx(a, abs=0.04)
    assert 0.4 < estimator.prior() < 0.8  # the global prior pools both requests


def test_prior_cannot_collapse_and_new_requests_start_from_it():
    estimator = AcceptanceEstimator(prior=0.6, prior_bounds=(0.1, 0.95))
    assert estimator.rate(spec("new")) == pytest.approx(0.6)
    for _ in range(1000):
        estimator.update(result("bad", 4, 0))
    assert estimator.rate(spec("bad")) < 0.01
    assert estimator.prior() == pytest.approx(0.1)
    assert estimator.rate(spec("fresh")) == pytest.approx(0.1)
    # The request's estimate lives on its record: the estimator keeps nothing of it.
    assert spec("bad").acceptance.keys() == {estimator.name}
    assert not request_state_in(estimator, lambda key: key in RECORDS)


def test_a_request_whose_acceptance_fell_to_zero_is_retried_now_and_then():
    policy = GoodputPolicy(
        LinearCost(0.01, 2e-3), max_draft_tokens=4, prior=0.1, explore_interval=5
    )
    for _ in range(50):
        policy.acceptance.update(result("dead", 4, 0))
    plans = [policy.plan(candidates("dead"), decode_base(1)) for _ in range(20)]
    retried = [i for i, plan in enumerate(plans) if plan]
    assert plans.count({"dead": 1}) == len(retried) == 3  # every 5th plan, one draft
    assert retried == [5, 10, 15]


def test_exploration_retries_one_idle_request_per_plan():
    policy = GoodputPolicy(
        LinearCost(0.01, 0.05), max_draft_tokens=4, prior=0.9, explore_interval=3
    )
    batch = candidates(*(f"r{i}" for i in range(4)))
    plans = [policy.plan(batch, decode_base(4)) for _ in range(12)]
    assert all(len(plan) <= 1 for plan in plans)  # steep cost: only the forced retry speculates
    explored = [request_id for plan in plans for request_id in plan]
    assert explored == [f"r{i % 4}" for i in range(9)]  # round robin from plan 4 on


def test_under_load_retries_come_about_once_per_four_plans():
    """16 idle requests: each is retried every 64 plans (four per candidate), so about one
    verify row per four plans is spent on retries, not one per plan."""
    policy = GoodputPolicy(
        LinearCost(0.01, 0.05), max_draft_tokens=4, prior=0.9, explore_interval=3
    )
    batch = candidates(*(f"r{i}" for i in range(16)))
    plans = [policy.plan(batch, decode_base(16)) for _ in range(96)]
    explored = [request_id for plan in plans for request_id in plan]
    assert 16 <= len(explored) <= 96 // 4 + 1
    assert set(explored) == {f"r{i}" for i in range(16)}  # every request is retried


def test_observe_feeds_the_cost_model_and_the_requests_own_acceptance():
    cost = LinearCost(0.01, 1e-3)
    policy = GoodputPolicy(cost, max_draft_tokens=4)
    features = decode_base(2).with_drafts(3, 1)
    policy.observe([result("a", 3, 3), result("b", 0, 0)], features, 0.015)
    assert cost.observed == [(features, 0.015)]
    assert spec("a").acceptance and not spec("b").acceptance  # b verified no drafts
    # Nothing of the requests stays in the policy: a finished request needs no release.
    policy.plan(candidates("a", "b"), decode_base(2))
    assert not request_state_in(policy, lambda key: key in RECORDS)


def test_until_the_cost_model_is_fitted_k_cycles_to_excite_it():
    class Unfitted(LinearCost):
        fitted = False

    policy = GoodputPolicy(Unfitted(0.01, 1e-3), max_draft_tokens=3)
    ks = [policy.plan(candidates("a"), decode_base(1)).get("a", 0) for _ in range(8)]
    assert sorted(set(ks)) == [0, 1, 2, 3]
    assert policy.last_predicted_step_time is None


def test_costly_draft_steps_shorten_chains():
    cheap = GoodputPolicy(LinearCost(0.01, 1e-4), max_draft_tokens=8, prior=0.8, draft_model=True)
    costly = GoodputPolicy(
        LinearCost(0.01, 1e-4, 4e-3), max_draft_tokens=8, prior=0.8, draft_model=True
    )
    k_cheap = cheap.plan(candidates("a"), decode_base(1))["a"]
    k_costly = costly.plan(candidates("a"), decode_base(1)).get("a", 0)
    assert k_cheap == 8 and 0 < k_costly < k_cheap


def test_tree_gains_are_sorted_path_probabilities_and_beat_a_chain():
    gains, depths = tree_gains(60)
    assert all(x >= y for x, y in zip(gains, gains[1:]))
    assert gains[:2] == pytest.approx((0.6, 0.6 * 0.6))  # the rank-1 chain start and a tie
    assert sum(gains[:8]) > sum(0.6**j for j in range(1, 9))  # same nodes, wider is better
    assert sum(gains) <= max(depths)  # at most one accepted node per depth
    assert tree_gains(100)[0][:5] == (1.0,) * 5 and tree_gains(100)[1][:5] == (1, 2, 3, 4, 5)
    assert tree_acceptance(sum(gains[:8]), 8) == pytest.approx(0.6)


def test_tree_mode_plans_node_budgets_from_tree_results():
    policy = GoodputPolicy(LinearCost(0.01, 1e-3), max_draft_tokens=32, tree=True, prior=0.5)
    for _ in range(40):
        policy.acceptance.update(result("good", 16, 6))
        policy.acceptance.update(result("poor", 16, 2))
        policy.acceptance.update(result("dead", 16, 0))
    plan = policy.plan(candidates("good", "poor", "dead", max_draft_tokens=64), decode_base(3))
    assert 0 < plan["poor"] < plan["good"] <= 32 and "dead" not in plan
    assert policy.rate(spec("good")) > policy.rate(spec("poor"))


def kind_result(request_id: str, kind: str, num_draft_tokens: int, num_accepted: int):
    return SpecResult(request_id, num_draft_tokens, num_accepted, spec=spec(request_id), kind=kind)


def test_acceptance_is_estimated_per_kind_of_proposal():
    """One request's long matches are accepted (a = 0.8), its short ones not (a = 0.2): each
    kind's estimate finds its own rate, a new request starts from each kind's prior, and the
    overall prior pools both."""
    rng = random.Random(5)
    estimator = AcceptanceEstimator(prior=0.5, decay=0.95, global_decay=0.995)
    for _ in range(800):
        kind, a = rng.choice((("n4", 0.8), ("n1", 0.2)))
        k = rng.randint(1, 4)
        accepted = 0
        while accepted < k and rng.random() < a:
            accepted += 1
        estimator.update(kind_result("r", kind, k, accepted))
    assert estimator.rate(spec("r"), "n4") == pytest.approx(0.8, abs=0.12)
    assert estimator.rate(spec("r"), "n1") == pytest.approx(0.2, abs=0.12)
    assert estimator.rate(spec("new"), "n4") == pytest.approx(0.8, abs=0.08)
    assert estimator.rate(spec("new"), "n1") == pytest.approx(0.2, abs=0.08)
    assert 0.3 < estimator.prior() < 0.7 and estimator.rate(spec("r")) == estimator.prior()
    assert set(spec("r").acceptance) == {"#n4", "#n1"}  # per kind, on the request's record


def test_goodput_speculates_on_the_kinds_that_pay():
    """Verification costs 30% of a step: a long match (taught a = 0.8) is worth drafting for,
    a 1-gram match (a = 0.15) is not, on the same request."""
    policy = GoodputPolicy(LinearCost(intercept=0.01, per_token=1e-4, per_spec_request=3e-3), 4)
    rng = random.Random(9)
    for _ in range(200):
        for kind, a in (("n4", 0.8), ("n1", 0.15)):
            accepted = 0
            while accepted < 4 and rng.random() < a:
                accepted += 1
            policy.observe([kind_result("r", kind, 4, accepted)], decode_base(1), 0.01)
    long_match = SpecCandidate("r", 200, 4, spec("r"), kind="n4")
    short_match = SpecCandidate("r", 200, 4, spec("r"), kind="n1")
    assert policy.plan([long_match], decode_base(1)).get("r", 0) >= 3
    assert policy.plan([short_match], decode_base(1)) == {}


def test_between_searches_requests_respond_to_the_last_prices():
    """After a full search, the next plans of a batch of about the same size give each request
    its best response at that search's prices: the same plan while nothing changed, a shorter
    chain for a request whose acceptance fell, and a full search again every REPRICE_EVERY
    plans or when the batch changes size."""
    cost = LinearCost(intercept=0.01, per_token=4e-4, per_spec_request=1e-3)
    policy = GoodputPolicy(cost, max_draft_tokens=6, explore_interval=1000)
    ids = ["a", "b", "c", "d"]
    for request_id, a in zip(ids, (0.9, 0.7, 0.5, 0.3)):
        teach(policy, request_id, a)
    searched = policy.plan(candidates(*ids, max_draft_tokens=6), decode_base(4))
    assert policy.held.prices is not None and len(set(searched.values())) >= 2
    assert policy.plan(candidates(*ids, max_draft_tokens=6), decode_base(4)) == searched
    teach(policy, "a", 0.2, rounds=60)
    responded = policy.plan(candidates(*ids, max_draft_tokens=6), decode_base(4))
    assert responded.get("a", 0) < searched["a"]
    assert policy.held.plans_since_search == 2
    policy.plan(candidates(*ids[:2], max_draft_tokens=6), decode_base(2))  # half the batch
    assert policy.held.plans_since_search == 0
    for _ in range(REPRICE_EVERY):
        policy.plan(candidates(*ids[:2], max_draft_tokens=6), decode_base(2))
    assert policy.held.plans_since_search < REPRICE_EVERY - 1


def goodput(policy: GoodputPolicy, cost, ids: list[str], plan: dict[str, int]) -> float:
    emitted = sum(expected_emitted(policy.rate(spec(r)), plan.get(r, 0)) for r in ids)
    drafts = decode_base(len(ids)).with_drafts(sum(plan.values()), len(plan))
    return emitted / cost.predict(drafts)


def test_a_response_to_a_searchs_prices_is_as_good_as_its_plan():
    """Prices taken from one search and applied to the same batch give a plan of the same
    predicted goodput (to 1%): the search's plan meets its own stationary condition."""
    rng = random.Random(4)
    responded = 0
    for trial in range(40):
        cost = LinearCost(
            intercept=rng.uniform(0.002, 0.03),
            per_token=rng.uniform(1e-5, 2e-3),
            per_spec_request=rng.choice([0.0, rng.uniform(0, 3e-3)]),
        )
        policy = GoodputPolicy(cost, max_draft_tokens=4, explore_interval=1000)
        ids = [f"t{trial}r{i}" for i in range(rng.randint(2, 6))]
        for request_id in ids:
            teach(policy, request_id, rng.uniform(0.05, 0.95))
        base = decode_base(len(ids))

        searched = policy.plan(candidates(*ids, max_draft_tokens=4), base)
        if policy.held.prices is None:
            continue
        again = policy.plan(candidates(*ids, max_draft_tokens=4), base)
        assert policy.held.plans_since_search == 1  # a response, not a search
        assert goodput(policy, cost, ids, again) >= 0.99 * goodput(policy, cost, ids, searched)
        responded += 1
    assert responded >= 30
