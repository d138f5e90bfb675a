"""The goodput search keeps forced probes (floors) at every batch size, and its "no drafts"
shortcut stays exact on step times that jump (the cost model's row ramps are not convex)."""

from __future__ import annotations

import itertools
import random

import pytest

from engine.speculation.control import search as search_module
from engine.speculation.control.acceptance import expected_emitted
from engine.speculation.control.search import SearchProblem, SearchSlot, best_lengths
from engine.speculation.control.step_features import ROW_KNOTS, StepFeatures
from tests.engine.speculation.control.test_goodput import LinearCost, decode_base
from tests.engine.speculation.test_proposer_choice import (  # noqa: F401 - fresh_records: autouse
    NAMES,
    candidates,
    choice_policy,
    fresh_records,
    result,
    spec,
)


def option(name: str, a: float, cap: int = 4, floor: int = 0) -> SearchSlot:
    gains = [a**j for j in range(1, cap + 1)]
    return SearchSlot(gains, range(1, cap + 1), cap, floor, name, name == "draft")


def test_a_forced_draft_model_probe_survives_a_batch_of_two():
    """The issue's repro: the first request is forced to one draft-model token; the search
    used to cut it to 0 (a draft-pass cap of 0 overrode the floor) and return ks = (0, k)."""
    cost = LinearCost(0.01, 1e-3, per_draft_step=0.02)
    slots = [[option("draft", 0.1, floor=1)], [option("ngram", 0.8), option("draft", 0.5)]]
    problem = SearchProblem(slots, decode_base(2), cost)
    found = best_lengths(problem)
    assert found.ks[0] >= 1
    assert problem.chosen(found.picks)[0].proposer == "draft"


@pytest.mark.parametrize("batch", [2, 16, 32])
def test_exploration_probes_run_at_every_batch_size(batch):
    """A policy simulation: n-gram wins on every request (the draft model, its passes cheap
    enough to win were all its drafts accepted, accepts 0.3), so only probes run the others.
    Every probe the policy forces must run with its proposer, and each request's draft and
    recycle estimates must be refreshed."""
    policy = choice_policy(LinearCost(0.01, 1e-3, per_draft_step=1e-4), explore_interval=4)
    forced = record_probes(policy)
    batch_ids = [f"r{i}" for i in range(batch)]
    true_rate = {"ngram": 0.9, "recycle": 0.2, "draft": 0.3}
    rng = random.Random(batch)
    ran = {name: set() for name in NAMES}
    honoured = 0
    for _ in range(12 * batch + 32):
        plan = policy.plan(candidates(*batch_ids), decode_base(batch))
        results = []
        for request_id, k in plan.items():
            name = spec(request_id).proposer
            ran[name].add(request_id)
            honoured += forced[-1:] == [(request_id, name)]
            accepted = 0
            while accepted < k and rng.random() < true_rate[name]:
                accepted += 1
            results.append(result(request_id, k, accepted, name))
        policy.observe(results, decode_base(batch), 0.01)
        forced.append(None)  # this plan's probe is settled
    probes = [probe for probe in forced if probe is not None]
    assert len(probes) >= 2 * batch and honoured == len(probes)
    assert ran["draft"] == set(batch_ids) and ran["recycle"] == set(batch_ids)


def record_probes(policy) -> list:
    """Wrap the policy's exploration to list each plan's forced (request, proposer)."""
    explore, forced = policy._explore, []

    def recording(batch, options, base, decoding):
        explore(batch, options, base, decoding)
        probe = [(c.request_id, o[0].proposer) for c, o in zip(batch, options) if o[0].floor > 0]
        forced.extend(probe)

    policy._explore = recording
    return forced


class JumpCost(LinearCost):
    """intercept + per row, plus a jump when the rows pass `knot` (the few-row matmul path
    ending): a step time that is piecewise linear between the cost model's row knots and not
    convex, the online model's form (its steep 5 -> 6 row segment)."""

    def __init__(self, knot: int, jump: float, **kwargs) -> None:
        super().__init__(**kwargs)
        self.knot, self.jump = knot, jump

    def predict(self, f: StepFeatures) -> float:
        return super().predict(f) + (self.jump if f.num_batched_tokens > self.knot else 0.0)


def brute_force(rates, cost, cap: int) -> float:
    base, best = decode_base(len(rates)), 0.0
    for ks in itertools.product(range(cap + 1), repeat=len(rates)):
        f = base.with_drafts(sum(ks), sum(k > 0 for k in ks))
        emitted = sum(expected_emitted(a, k) for a, k in zip(rates, ks, strict=True))
        best = max(best, emitted / cost.predict(f))
    return best


def search(rates, cost, cap: int = 4):
    slots = [SearchSlot([a**j for j in range(1, cap + 1)], range(1, cap + 1), cap) for a in rates]
    return best_lengths(SearchProblem(slots, decode_base(len(rates)), cost))


@pytest.mark.parametrize("jump", [0.010, 0.020, 0.030])
def test_a_jump_in_step_time_does_not_hide_long_chains(jump):
    """The issue's case: five requests, 40 ms + 8.25 ms per row, a jump from 5 to 6 rows,
    acceptance 0.9. The first draft pays the jump, later ones are cheap: k = 3-4 wins."""
    cost = JumpCost(5, jump, intercept=0.040, per_token=0.00825)
    rates = [0.9] * 5
    found = search(rates, cost)
    assert sum(found.ks) > 0
    assert found.goodput >= (1 - 1e-9) * brute_force(rates, cost, 4)


def test_no_drafts_is_returned_only_when_it_is_the_optimum_on_jumping_costs():
    rng = random.Random(7)
    fired = 0
    for _ in range(150):
        n = rng.randint(2, 4)
        rates = [rng.uniform(0.0, 0.95) for _ in range(n)]
        cost = JumpCost(
            knot=rng.choice([k for k in ROW_KNOTS if n <= k <= 5 * n]),
            jump=rng.uniform(0.0, 0.03),
            intercept=rng.uniform(0.005, 0.04),
            per_token=rng.uniform(1e-4, 8e-3),
            per_spec_request=rng.choice([0.0, rng.uniform(0, 0.01)]),
        )
        best = brute_force(rates, cost, 4)
        found = search(rates, cost)
        if not any(found.ks):
            assert found.goodput >= (1 - 1e-12) * best
            fired += 1
    assert fired > 10  # the shortcut's answer occurs


def search_with_caps(rates, caps, cost, caps_first: bool):
    slots = [
        SearchSlot([a**j for j in range(1, c + 1)], range(1, c + 1), c) for a, c in zip(rates, caps)
    ]
    problem = SearchProblem(slots, decode_base(len(rates)), cost, caps_first=caps_first)
    return best_lengths(problem), search_module._caps_if_best(problem)


def brute_force_caps(rates, caps, cost) -> tuple[float, tuple[int, ...]]:
    base, best = decode_base(len(rates)), (0.0, ())
    for ks in itertools.product(*(range(c + 1) for c in caps)):
        f = base.with_drafts(sum(ks), sum(k > 0 for k in ks))
        emitted = sum(expected_emitted(a, k) for a, k in zip(rates, ks, strict=True))
        best = max(best, (emitted / cost.predict(f), ks))
    return best


@pytest.mark.parametrize("caps_first", [False, True])
def test_every_request_at_its_cap_is_returned_only_when_it_is_the_optimum(caps_first):
    """The "caps" shortcut (search._caps_if_best): on GPU-like costs (a draft row nearly free,
    a jump where the rows pass a knot) it fires often, and whenever it answers, nothing beats
    it; trying it first (the policy's hint) finds the same plan as not trying it, or better."""
    rng = random.Random(11)
    fired = optimal = 0
    for _ in range(150):
        n = rng.randint(2, 4)
        rates = [rng.uniform(0.0, 0.95) for _ in range(n)]
        caps = [rng.randint(1, 4) for _ in range(n)]
        cost = JumpCost(
            knot=rng.choice([k for k in ROW_KNOTS if n <= k <= 5 * n]),
            jump=rng.choice([0.0, rng.uniform(0.0, 0.001)]),
            intercept=rng.uniform(0.001, 0.004),
            per_token=rng.uniform(1e-6, rng.choice([5e-5, 3e-4])),
            per_spec_request=rng.choice([0.0, rng.uniform(0, 3e-4)]),
        )
        best, best_ks = brute_force_caps(rates, caps, cost)
        optimal += list(best_ks) == caps
        found, shortcut = search_with_caps(rates, caps, cost, caps_first)
        other, _ = search_with_caps(rates, caps, cost, not caps_first)
        assert found.goodput >= (1 - 1e-12) * min(other.goodput, best)  # the order costs nothing
        if shortcut is not None:
            assert list(shortcut.ks) == caps
            assert shortcut.goodput >= (1 - 1e-12) * best
            fired += 1
    assert optimal >= 20 and fired >= 0.8 * optimal  # it answers where caps are best
