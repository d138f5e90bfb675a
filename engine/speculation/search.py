"""The goodput search: a draft count k_i per request maximising expected tokens per second.

    maximise  G(k) = sum_i E_i(k_i) / T(features(k))   over  floor_i <= k_i <= cap_i

E_i(k) = 1 + g_i(1) + ... + g_i(k): g_i(j) is the probability that request i's j-th draft (or
best-first tree node) is accepted; it shrinks with j. T is the cost model's step time. It has
fixed costs that a one-draft-at-a-time search never pays for: the first draft of a request
(verification of a speculating request), every draft-model pass (max k over the batch), an
eager step instead of a replayed graph. So the search works on the ratio as a whole
(Dinkelbach's method): at goodput level L, pick each k_i to maximise

    E_i(k_i) - L * (c_token * k_i + c_request * [k_i > 0])

where c_token and c_request are the cost model's marginal costs at the current plan, then
raise L to the new plan's goodput, until it stops improving. Draft-model passes are handled by
running that for every cap M on the deepest chain (passes = M). The best of those plans and of
the uniform plans (every request at min(c, cap_i)) is returned; tests compare it with brute
force, fixed costs included.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.speculation.cost_model import StepCostModel
from engine.speculation.step_features import StepFeatures

MAX_ROUNDS = 8  # Dinkelbach rounds per cap; it converges in 2-3 on real cost models


@dataclass
class SearchSlot:
    """One candidate: marginal gains of drafts 1..cap, the draft-model passes each needs."""

    gains: Sequence[float]
    depths: Sequence[int]
    cap: int
    floor: int = 0  # a forced minimum (exploration of an idle request)
    cumulative: list[float] = field(init=False)

    def __post_init__(self) -> None:
        total, self.cumulative = 0.0, [0.0]
        for gain in self.gains[: self.cap]:
            total += gain
            self.cumulative.append(total)


@dataclass(frozen=True)
class SearchResult:
    ks: tuple[int, ...]
    predicted_seconds: float
    goodput: float  # expected emitted tokens per second


@dataclass(frozen=True)
class SearchProblem:
    slots: Sequence[SearchSlot]
    base: StepFeatures
    cost_model: StepCostModel
    draft_model: bool = False
    graphs: bool = False
    token_budget: int | None = None

    def features(self, ks: Sequence[int]) -> StepFeatures:
        steps = max((s.depths[k - 1] for s, k in zip(self.slots, ks) if k > 0), default=0)
        return self.base.with_drafts(
            sum(ks), sum(1 for k in ks if k > 0), steps if self.draft_model else 0, self.graphs
        )

    def evaluate(self, ks: Sequence[int]) -> SearchResult:
        emitted = sum(1.0 + s.cumulative[k] for s, k in zip(self.slots, ks))
        seconds = self.cost_model.predict(self.features(ks))
        return SearchResult(tuple(ks), seconds, emitted / seconds)

    def fits(self, ks: Sequence[int]) -> bool:
        budget = self.token_budget
        return budget is None or self.base.num_batched_tokens + sum(ks) <= budget


def best_lengths(problem: SearchProblem) -> SearchResult:
    """The best plan found: uniform plans first (the m requests with the best first draft at
    min(c, cap_i), for every m and c), then Dinkelbach rounds per cap started from the best of
    them, whose batch-wide fixed costs are already paid, so each request's first draft is
    charged only its own cost."""
    slots = problem.slots
    max_cap = max((s.cap for s in slots), default=0)
    best = _best_uniform(problem, problem.evaluate([s.floor for s in slots]), max_cap)
    caps = range(1, max_cap + 1) if problem.draft_model else [max_cap]
    start = best
    for cap in caps:
        ks = _within_budget(problem, _dinkelbach(problem, cap, start))
        result = problem.evaluate(ks)
        if result.goodput > best.goodput * (1.0 + 1e-12):
            best = result
    return best


def _best_uniform(problem: SearchProblem, best: SearchResult, max_cap: int) -> SearchResult:
    """The best m-requests-at-c plan (requests ranked by their first gain), each evaluated in
    O(1) from running totals as the m-th request joins."""
    slots, base = problem.slots, problem.base
    order = sorted(range(len(slots)), key=lambda i: -slots[i].cumulative[min(1, slots[i].cap)])
    floors = [s.floor for s in slots]
    floor_emitted = sum(1.0 + s.cumulative[s.floor] for s in slots)
    counts = _checked_counts(len(slots))
    for c in range(1, max_cap + 1):
        ks, emitted = list(floors), floor_emitted
        drafts, spec, steps = sum(floors), sum(1 for k in floors if k > 0), max(floors, default=0)
        for m, i in enumerate(order, start=1):
            slot, k = slots[i], max(slots[i].floor, min(c, slots[i].cap))
            emitted += slot.cumulative[k] - slot.cumulative[ks[i]]
            drafts += k - ks[i]
            spec += (k > 0) - (ks[i] > 0)
            steps = max(steps, slot.depths[k - 1] if k > 0 else 0)
            ks[i] = k
            budget = problem.token_budget
            if budget is not None and base.num_batched_tokens + drafts > budget:
                break
            if m not in counts:
                continue
            features = base.with_drafts(
                drafts, spec, steps if problem.draft_model else 0, problem.graphs
            )
            seconds = problem.cost_model.predict(features)
            if emitted / seconds > best.goodput * (1.0 + 1e-12):
                best = SearchResult(tuple(ks), seconds, emitted / seconds)
    return best


def _checked_counts(n: int) -> set[int]:
    """Every m up to 16, then about 1.5x apart: the best m of a large batch is found to within
    a few requests, which the Dinkelbach rounds that follow then settle one by one."""
    counts, m = set(range(1, min(n, 16) + 1)), 16
    while m < n:
        m = min(n, int(m * 1.5))
        counts.add(m)
    return counts


def _dinkelbach(problem: SearchProblem, cap: int, start: SearchResult) -> list[int]:
    """Plans with every k_i <= cap by Dinkelbach rounds from the goodput of `start`."""
    slots = problem.slots
    level, ks = start.goodput, [min(k, cap) for k in start.ks]
    best_ks, best_goodput = ks, start.goodput
    for _ in range(MAX_ROUNDS):
        per_token, per_request = _marginal_costs(problem, ks, cap)
        chosen = [_best_k(s, min(cap, s.cap), level, per_token, per_request) for s in slots]
        result = problem.evaluate(chosen)
        if result.goodput > best_goodput:
            best_ks, best_goodput = chosen, result.goodput
        if chosen == ks or result.goodput <= level * (1.0 + 1e-12):
            break
        ks, level = chosen, result.goodput
    return best_ks


def _marginal_costs(problem: SearchProblem, ks: Sequence[int], cap: int) -> tuple[float, float]:
    """Seconds of one more draft on a speculating request, and the extra fixed seconds of a
    request's first draft (with the passes of a cap-deep chain paid once when any speculates)."""
    predict, graphs = problem.cost_model.predict, problem.graphs
    features = problem.features(ks)
    seconds = predict(features)
    passes = cap if problem.draft_model else 0
    first = features.with_drafts(1, 1, passes, graphs)
    # The token cost is measured past the first draft, so that while nobody speculates the
    # batch's fixed costs (passes, an eager step) land on the first request, not on every token;
    # the uniform plans in best_lengths cover sharing them across requests.
    per_token = max(0.0, predict(first.with_drafts(1, 0, passes, graphs)) - predict(first))
    per_request = max(0.0, predict(first) - seconds - per_token)
    return per_token, per_request


def _best_k(slot: SearchSlot, cap: int, level: float, per_token: float, per_request: float) -> int:
    """argmax over k in [floor, cap] of E(k) - level * (per_token * k + per_request * [k > 0])."""
    best_k, best_value = slot.floor, -float("inf")
    for k in range(slot.floor, cap + 1):
        cost = level * (per_token * k + (per_request if k > 0 else 0.0))
        value = slot.cumulative[k] - cost
        if value > best_value:
            best_k, best_value = k, value
    return best_k


def _within_budget(problem: SearchProblem, ks: list[int]) -> list[int]:
    """Drop the least valuable drafts until the step fits the token budget."""
    ks = list(ks)
    while not problem.fits(ks):
        options = [
            (slot.gains[k - 1], i)
            for i, (slot, k) in enumerate(zip(problem.slots, ks))
            if k > slot.floor
        ]
        if not options:
            break
        ks[min(options)[1]] -= 1
    return ks
