"""Goodput policy: acceptance estimates, the greedy k search, exploration, trees."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.speculation.acceptance import (
    AcceptanceEstimator,
    expected_emitted,
    tree_acceptance,
    tree_gains,
)
from engine.speculation.goodput import GoodputPolicy, SearchSlot, greedy_lengths
from engine.speculation.policy import SpecCandidate, SpecResult
from engine.speculation.step_features import StepFeatures


class LinearCost:
    """A synthetic step-time model: intercept + per batched token + per draft step."""

    def __init__(self, intercept: float, per_token: float, per_draft_step: float = 0.0) -> None:
        self.intercept, self.per_token, self.per_draft_step = intercept, per_token, per_draft_step
        self.num_observations = 0
        self.observed: list[tuple[StepFeatures, float]] = []

    def predict(self, f: StepFeatures) -> float:
        steps = self.per_draft_step * f.num_draft_steps
        return self.intercept + self.per_token * f.num_batched_tokens + steps

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


def teach(policy: GoodputPolicy, request_id: str, acceptance: float, rounds: int = 30) -> None:
    """Feed results as if every chain of 4 accepted a fraction `acceptance` per position."""
    rng = random.Random(request_id)
    for _ in range(rounds):
        accepted = 0
        while accepted < 4 and rng.random() < acceptance:
            accepted += 1
        policy.acceptance.update(SpecResult(request_id, 4, accepted))


def candidates(*request_ids: str, max_draft_tokens: int = 8) -> list[SpecCandidate]:
    return [SpecCandidate(request_id, 200, max_draft_tokens) for request_id in request_ids]


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
    rates = policy.acceptance_rates()
    assert rates["good"] > 0.75 and rates["poor"] < 0.3


def test_k_respects_each_request_cap_and_the_token_budget():
    cost = LinearCost(intercept=0.02, per_token=1e-5)
    policy = GoodputPolicy(cost, max_draft_tokens=8, prior=0.9)
    capped = [SpecCandidate("a", 200, 2), SpecCandidate("b", 200, 0), SpecCandidate("c", 200, 9)]
    assert policy.plan(capped, decode_base(3)) == {"a": 2, "c": 8}
    budgeted = GoodputPolicy(cost, max_draft_tokens=8, prior=0.9, token_budget=3 + 5)
    assert sum(budgeted.plan(candidates("a", "b", "c"), decode_base(3)).values()) == 5


def test_greedy_search_is_near_the_brute_force_optimum():
    rng = random.Random(0)
    for _ in range(40):
        rates = [rng.random() for _ in range(3)]
        cost = LinearCost(rng.uniform(0.005, 0.03), rng.uniform(1e-4, 5e-3), rng.uniform(0, 3e-3))
        base = decode_base(3)
        best = 0.0
        for ks in itertools.product(range(5), repeat=3):
            f = base.with_drafts(sum(ks), sum(k > 0 for k in ks), max(ks))
            emitted = sum(expected_emitted(a, k) for a, k in zip(rates, ks, strict=True))
            best = max(best, emitted / cost.predict(f))
        slots = [SearchSlot([a**j for j in range(1, 5)], range(1, 5), 4) for a in rates]
        result = greedy_lengths(slots, base, cost, draft_model=True)
        assert result.goodput >= 0.98 * best


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
            estimator.update(SpecResult(request_id, k, accepted))
            history.append(estimator.rate(request_id))
        assert sum(history[-300:]) / 300 == pytest.approx(a, abs=0.04)
    assert 0.4 < estimator.prior() < 0.8  # the global prior pools both requests


def test_prior_cannot_collapse_and_new_requests_start_from_it():
    estimator = AcceptanceEstimator(prior=0.6, prior_bounds=(0.1, 0.95))
    assert estimator.rate("new") == pytest.approx(0.6)
    for _ in range(1000):
        estimator.update(SpecResult("bad", 4, 0))
    assert estimator.rate("bad") < 0.01
    assert estimator.prior() == pytest.approx(0.1)
    assert estimator.rate("fresh") == pytest.approx(0.1)
    estimator.release("bad")
    assert "bad" not in estimator.rates()


def test_a_request_whose_acceptance_fell_to_zero_is_retried_now_and_then():
    policy = GoodputPolicy(
        LinearCost(0.01, 2e-3), max_draft_tokens=4, prior=0.1, explore_interval=5
    )
    for _ in range(50):
        policy.acceptance.update(SpecResult("dead", 4, 0))
    plans = [policy.plan(candidates("dead"), decode_base(1)) for _ in range(20)]
    retried = [i for i, plan in enumerate(plans) if plan]
    assert plans.count({"dead": 1}) == len(retried) == 3  # every 5th plan, one draft
    assert retried == [5, 10, 15]


def test_exploration_retries_one_idle_request_per_plan():
    policy = GoodputPolicy(
        LinearCost(0.01, 0.05), max_draft_tokens=4, prior=0.9, explore_interval=3
    )
    batch = candidates(*(f"r{i}" for i in range(6)))
    plans = [policy.plan(batch, decode_base(6)) for _ in range(12)]
    assert all(len(plan) <= 1 for plan in plans)  # steep cost: only the forced retry speculates
    explored = [request_id for plan in plans for request_id in plan]
    assert explored == [f"r{i % 6}" for i in range(9)]  # round robin from plan 4 on


def test_observe_feeds_the_cost_model_and_acceptance_and_release_forgets():
    cost = LinearCost(0.01, 1e-3)
    policy = GoodputPolicy(cost, max_draft_tokens=4)
    features = decode_base(2).with_drafts(3, 1)
    policy.observe([SpecResult("a", 3, 3), SpecResult("b", 0, 0)], features, 0.015)
    assert cost.observed == [(features, 0.015)]
    assert policy.acceptance_rates().keys() == {"a"}
    policy.release("a")
    assert policy.acceptance_rates() == {}


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
        policy.acceptance.update(SpecResult("good", 16, 6))
        policy.acceptance.update(SpecResult("poor", 16, 2))
        policy.acceptance.update(SpecResult("dead", 16, 0))
    plan = policy.plan(candidates("good", "poor", "dead", max_draft_tokens=64), decode_base(3))
    assert 0 < plan["poor"] < plan["good"] <= 32 and "dead" not in plan
    assert policy.acceptance_rates()["good"] > policy.acceptance_rates()["poor"]
