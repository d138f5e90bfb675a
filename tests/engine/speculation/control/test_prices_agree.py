"""Between searches the policy answers with each request's best response at the last search's
prices (its level and marginal seconds just past the plan). Where the step time jumps right
past the plan, those prices misprice every draft: the policy keeps them only when the
responses reproduce the search's plan, and otherwise searches again."""

from __future__ import annotations

from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.held_prices import REPRICE_EVERY
from engine.speculation.control.step_features import StepFeatures
from tests.engine.speculation.control.test_goodput import (
    LinearCost,
    candidates,
    decode_base,
    teach,
)


class JumpCost(LinearCost):
    """LinearCost plus a jump once a step batches `rows` tokens or more (as the Qwen 1.5B's
    measured step from 5 to 6 rows)."""

    def __init__(self, rows: int, jump: float, *args) -> None:
        super().__init__(*args)
        self.rows, self.jump = rows, jump

    def predict(self, f: StepFeatures) -> float:
        extra = self.jump if f.num_batched_tokens >= self.rows else 0.0
        return super().predict(f) + extra


def test_a_chain_the_search_found_paying_keeps_running_past_a_jump_beyond_it():
    """Batch 1, chains of 4 (5 rows), a=0.95: a 35 ms decode, 8 ms per draft, 30 ms more from
    6 rows. Every plan is k=4; on the prices taken at 4 drafts (one more draft costs 38 ms)
    the best response was no drafts, for REPRICE_EVERY - 1 plans out of every REPRICE_EVERY."""
    policy = GoodputPolicy(JumpCost(6, 0.030, 0.027, 0.008), max_draft_tokens=4)
    teach(policy, "r", 0.95, rounds=60)
    plans = [
        policy.plan(candidates("r", max_draft_tokens=4), decode_base(1))
        for _ in range(3 * REPRICE_EVERY)
    ]
    assert [plan.get("r", 0) for plan in plans] == [4] * len(plans)


def test_prices_that_agree_with_the_search_are_kept():
    """On a linear step time the responses reproduce the search's plan, so the policy keeps
    answering from the prices between searches."""
    policy = GoodputPolicy(LinearCost(0.027, 0.008), max_draft_tokens=4)
    for request_id, a in (("good", 0.95), ("poor", 0.05)):
        teach(policy, request_id, a, rounds=60)
    batch = candidates("good", "poor", max_draft_tokens=4)
    first = policy.plan(batch, decode_base(2))
    assert policy.held.prices is not None
    assert [policy.plan(batch, decode_base(2)) for _ in range(3)] == [first] * 3
    assert policy.held.plans_since_search == 3
