"""HeldPrices: the last full search's prices, held between searches.

At the search's optimum each request's k maximises E(k) - level * seconds(k) at the plan's
prices (search.Prices, Dinkelbach's condition), so while the batch keeps about its size and
shape the goodput policy gives each request its best response at those prices for up to
REPRICE_EVERY plans instead of searching again: no cost-model calls. Prices are held only where
a request's k depends on nothing shared (one option per request, no draft-model passes) and
where each request's best response at them is its k in the plan (responses_agree).
"""

from __future__ import annotations

from engine.speculation.control.padded_plans import plan_prices
from engine.speculation.control.search import Prices, SearchProblem, SearchResult, best_response
from engine.speculation.control.step_features import StepFeatures

# Between full searches, each request's k is its best response at the last search's prices
# for up to this many plans, while the batch keeps about its size and shape.
REPRICE_EVERY = 8


class HeldPrices:
    """The prices of the last search (None: search next plan) and the step they priced."""

    def __init__(self, margin: float) -> None:
        self.margin = margin  # drafts priced at the level times 1 + margin (DRAFT_MARGIN)
        self.prices: Prices | None = None
        self.base = StepFeatures()
        self.plans_since_search = 0

    def take(
        self, problem: SearchProblem, result: SearchResult, base: StepFeatures, simple: bool
    ) -> None:
        """Keep a search's prices where `simple` (no proposer choice, no draft-model passes)
        and where each request's best response at them is its k in the plan."""
        prices = plan_prices(problem, result) if simple and result.goodput > 0 else None
        agree = prices is not None and responses_agree(problem, result, prices, self.margin)
        self.prices = prices if agree else None
        self.base, self.plans_since_search = base, 0

    def hold(self, base: StepFeatures) -> bool:
        """The held prices still price this step: few plans since, about the same batch (size
        within a quarter, the same eager or replayed step)."""
        if self.prices is None or self.plans_since_search >= REPRICE_EVERY - 1:
            return False
        then = self.base
        size = max(1, then.num_requests // 4)
        return (
            abs(base.num_requests - then.num_requests) <= size
            and base.num_eager_steps == then.num_eager_steps
            and abs(base.num_batched_tokens - then.num_batched_tokens)
            <= max(1, then.num_batched_tokens // 4)
        )

    def respond(self, gains: list[float], cap: int, floor: int) -> int:
        """One request's best response at the held prices (hold() said they price the step)."""
        assert self.prices is not None
        return best_response(gains, cap, floor, self.prices, self.margin)

    def drop(self) -> None:
        """Search at the next plan (the token budget binds: the search decides which drafts go)."""
        self.prices = None


def responses_agree(
    problem: SearchProblem, result: SearchResult, prices: Prices, margin: float
) -> bool:
    """Whether every request's best response at `prices` (as HeldPrices prices it) is its k in
    the search's plan. Prices are the step's marginal seconds just past the plan; where the
    step time is not linear there (a row knot, as on the Qwen 1.5B from 5 to 6 rows, one more
    draft after a batch-1 chain of 4) they price every draft at the jump, and the responses
    would drop drafts the search found paying (docs/benchmarks.md §5n). Then the next plan
    searches again."""
    return all(  # one option per request: prices are taken only without proposer choice
        best_response(slot.gains, slot.cap, slot.floor, prices, margin) == k
        for [slot], k in zip(problem.options, result.ks)
    )
