"""A step that verifies any drafts pays a fixed cost besides its drafts and speculating
requests (on an H200 at 16 requests 0.46 ms over a 2.3 ms plain step, however few drafts:
docs/benchmarks.md §4j). The cost model fits it as its own term (verify_steps) and the search
pays it once per step."""

from __future__ import annotations

import random

import pytest

from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.padded_plans import best_plan, plan_prices
from engine.speculation.control.search import best_response
from engine.speculation.control.step_features import StepFeatures
from tests.engine.speculation.control.test_cost_model import TRUE, VERIFY_16, true_seconds
from tests.engine.speculation.control.test_goodput import LinearCost
from tests.engine.speculation.control.test_padded_plans import PaddedCost, problem_of
from tests.engine.speculation.control.test_padded_plans import brute_force as padded_brute_force
from tests.engine.speculation.control.test_search_floors import brute_force, search

VERIFY_COST = TRUE | {"verify_steps": 6e-3}


def with_verify(f: StepFeatures) -> float:
    """TRUE's step plus VERIFY_COST's fixed cost where any request verifies drafts."""
    return true_seconds(f) + VERIFY_COST["verify_steps"] * (f.num_spec_requests > 0)


def replayed_steps(rng: random.Random) -> StepFeatures:
    """Decode batches of 1-16 requests replaying verification graphs, some requests drafting."""
    shapes = []
    for _ in range(rng.randint(1, 16)):
        k = rng.choice([0, 0, 0, rng.randint(1, 4)])
        shapes.append((rng.randint(16, 2048), 1, k))
    return StepFeatures.from_shapes(shapes, graphs=VERIFY_16)


def fitted(seconds, seed: int) -> OnlineLinearCostModel:
    rng = random.Random(seed)
    model = OnlineLinearCostModel()
    for i in range(600):
        f = replayed_steps(rng)
        if i % 8 == 0:
            model.predict(f)
        model.observe(f, seconds(f) * rng.gauss(1.0, 0.02))
    return model


def test_the_fit_prices_a_verifying_step_with_few_drafts_as_measured():
    """With the fixed cost in the truth, the fit puts it where it is: one request of 16
    verifying two drafts, and all sixteen, each cost what the truth says over a plain step."""
    model = fitted(with_verify, seed=5)
    plain = StepFeatures.from_shapes([(600, 1, 0)] * 16, graphs=VERIFY_16)
    for step in (plain.with_drafts(2, 1, 0, VERIFY_16), plain.with_drafts(32, 16, 0, VERIFY_16)):
        extra = model.predict(step) - model.predict(plain)
        assert extra == pytest.approx(with_verify(step) - with_verify(plain), rel=0.2)
    assert model.coefficients()["verify_steps"] == pytest.approx(
        VERIFY_COST["verify_steps"], rel=0.2
    )


def test_without_such_a_cost_the_term_stays_near_nothing():
    model = fitted(true_seconds, seed=6)
    assert model.coefficients()["verify_steps"] < 0.1 * VERIFY_COST["verify_steps"]
    plain = StepFeatures.from_shapes([(600, 1, 0)] * 16, graphs=VERIFY_16)
    one = plain.with_drafts(2, 1, 0, VERIFY_16)
    extra = model.predict(one) - model.predict(plain)
    assert extra == pytest.approx(true_seconds(one) - true_seconds(plain), rel=0.3, abs=2e-4)


class WithVerify:
    """A test cost model plus a fixed cost on every step that verifies any drafts."""

    def __init__(self, cost, per_verify_step: float) -> None:
        self.cost, self.per_verify_step = cost, per_verify_step

    def predict(self, f: StepFeatures) -> float:
        return self.cost.predict(f) + self.per_verify_step * (f.num_spec_requests > 0)


def verify_cost(*args, per_verify_step: float, **kwargs) -> WithVerify:
    return WithVerify(LinearCost(*args, **kwargs), per_verify_step)


def padded_verify_cost(*args, per_verify_step: float) -> WithVerify:
    return WithVerify(PaddedCost(*args), per_verify_step)


def test_the_search_reaches_the_brute_force_optimum_with_a_cost_per_verifying_step():
    rng = random.Random(11)
    for _ in range(120):
        rates = [rng.random() for _ in range(rng.randint(1, 4))]
        cost = verify_cost(
            rng.uniform(0.005, 0.03),
            rng.uniform(1e-5, 2e-3),
            per_spec_request=rng.choice([0.0, rng.uniform(0, 0.005)]),
            per_verify_step=rng.uniform(0, 0.02),
        )
        found = search(rates, cost, cap=3)
        assert found.goodput >= (1 - 1e-9) * brute_force(rates, cost, 3), (rates, vars(cost))


def test_a_lone_draft_does_not_pay_the_verifying_step_that_many_drafts_share():
    """16 requests, 2.3 ms steps, a draft row nearly free, 0.46 ms to verify at all: one
    request at acceptance 0.35 is not worth a verifying step, sixteen are."""
    cost = verify_cost(2.3e-3, 1e-6, per_verify_step=0.46e-3)
    alone = search([0.35] + [0.0] * 15, cost, cap=4)
    assert sum(alone.ks) == 0
    together = search([0.35] * 16, cost, cap=4)
    assert sum(together.ks) > 0
    cheap = verify_cost(2.3e-3, 1e-6, per_verify_step=0.0)
    assert sum(search([0.35] + [0.0] * 15, cheap, cap=4).ks) > 0


def test_the_padded_search_reaches_the_brute_force_optimum_with_a_cost_per_verifying_step():
    rng = random.Random(12)
    for _ in range(120):
        n = rng.randint(2, 5)
        rates = [rng.choice([rng.uniform(0, 0.3), rng.uniform(0.5, 0.95)]) for _ in range(n)]
        cost = padded_verify_cost(
            rng.uniform(2e-3, 4e-3),
            rng.uniform(1e-6, 3e-5),
            0.0,
            rng.choice([0.0, rng.uniform(0, 1e-4)]),
            per_verify_step=rng.uniform(0, 1e-3),
        )
        problem = problem_of(rates, cost)
        assert best_plan(problem).goodput >= (1 - 1e-9) * padded_brute_force(problem, 4)


def test_held_prices_after_a_plan_without_drafts_charge_a_first_draft_for_verifying():
    """Between searches the policy plans by the last search's prices: after a plan without
    drafts, a lone request's best response must still pay for a verifying step."""
    cost = padded_verify_cost(2.3e-3, 1e-7, 0.0, 0.0, per_verify_step=0.46e-3)
    problem = problem_of([0.35] * 16, cost)
    result = best_plan(problem)
    lone = problem_of([0.35] + [0.0] * 15, cost)
    none = best_plan(lone)
    assert sum(none.ks) == 0 and sum(result.ks) > 0
    prices = plan_prices(lone, none)
    gains = [0.35**j for j in range(1, 5)]
    assert best_response(gains, 4, 0, prices) == 0
    cheap = padded_verify_cost(2.3e-3, 1e-7, 0.0, 0.0, per_verify_step=0.0)
    assert sum(best_plan(problem_of([0.35] + [0.0] * 15, cheap)).ks) > 0  # free to verify
