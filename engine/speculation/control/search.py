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

Proposer choice (several proposers loaded): a request's slot is one option per proposer, each
with its own gains curve, and it picks the option and k maximising the same per-request value.
Only the options that run the draft model are held to the pass cap M and charged its passes
(once per batch: the draft runs once per depth for every request using it); a model-free
option pays its measured CPU seconds per request (`propose_seconds`) and no passes. M = 0 is
tried too, so the plan without the draft model competes.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from engine.speculation.control.search_problem import SearchProblem, SearchResult, SearchSlot
from engine.speculation.control.step_features import ROW_KNOTS, StepFeatures

__all__ = ["SearchProblem", "SearchResult", "SearchSlot", "best_lengths"]

MAX_ROUNDS = 8  # Dinkelbach rounds per cap; it converges in 2-3 on real cost models


def best_lengths(problem: SearchProblem) -> SearchResult:
    """The best plan found: uniform plans first (the m requests with the best first draft at
    min(c, cap_i), for every m and c, all with one proposer), then Dinkelbach rounds per cap
    started from the best of them, whose batch-wide fixed costs are already paid, so each
    request's first draft is charged only its own cost."""
    if len(problem.options) == 1:
        return _one_request(problem)
    floors = [options[0].floor for options in problem.options]
    best = problem.evaluate(floors)
    if _floors_are_best(problem, best):
        return best
    for picks in _uniform_picks(problem):
        best = _best_uniform(problem, best, picks)
    max_cap = max((o.cap for options in problem.options for o in options), default=0)
    if problem.any_draft:
        lowest = max(0 if problem.any_free else 1, _forced_passes(problem))
        caps = range(lowest, _max_draft_cap(problem) + 1)
    else:
        caps = range(max_cap, max_cap + 1)
    start = best
    for cap in caps:
        ks, picks = _dinkelbach(problem, cap, start)
        ks = _within_budget(problem, ks, picks)
        result = problem.evaluate(ks, picks)
        if result.goodput > best.goodput * (1.0 + 1e-12) and _keeps_floors(problem, result):
            best = result
    return best


def _forced_passes(problem: SearchProblem) -> int:
    """The fewest draft-model passes every plan runs: a slot whose only options run the draft
    model and that is forced to speculate (an exploration probe) needs `floor` of them."""
    return max(
        (
            min(o.floor for o in options)
            for options, flags in zip(problem.options, problem.draft_flags)
            if all(flags)
        ),
        default=0,
    )


def _keeps_floors(problem: SearchProblem, result: SearchResult) -> bool:
    slots = problem.chosen(result.picks)
    return all(k >= s.floor for s, k in zip(slots, result.ks))


def _floors_are_best(problem: SearchProblem, floors: SearchResult) -> bool:
    """Whether no plan beats the floors (every request at its floor, most often no drafts at
    all), checked in one pass: the common case under load at low acceptance, where the full
    search cost ~1 ms a step. Only when nothing is shared between requests (no draft-model
    passes, no eager step): then a plan's extra seconds are T(D) - T(0) for its D extra drafts
    plus `request` per newly speculating request. The step time is piecewise linear in the
    rows between the cost model's ROW_KNOTS, not convex (a jump where the few-row matmul path
    ends), so the cheapest draft is priced at the least average cost of D drafts over every D,
    (T(D) - T(0)) / D, which on each linear piece is least at one of its ends. A plan beats
    the floors' goodput L only if some request's extra expected tokens exceed L times that
    lower bound of its extra seconds, so "floors" is only returned at the optimum."""
    if problem.any_draft or problem.graphs.eager_on_drafts:
        return False
    predict = problem.cost_model.predict
    features = problem.features(floors.ks, floors.picks)
    seconds = predict(features)
    token = _least_draft_seconds(problem, floors, features, seconds)
    one_more = features.with_drafts(1, 0)
    request = max(0.0, predict(one_more.with_drafts(0, 1)) - predict(one_more))
    level = floors.goodput
    for options, floor_k in zip(problem.options, floors.ks):
        for slot in options:
            fixed = (request if floor_k == 0 else 0.0) + slot.propose_seconds
            base = slot.cumulative[floor_k] if floor_k <= slot.cap else 0.0
            for k in range(max(floor_k, slot.floor) + 1, slot.cap + 1):
                if slot.cumulative[k] - base > level * (fixed + (k - floor_k) * token):
                    return False
    return True


def _least_draft_seconds(
    problem: SearchProblem, floors: SearchResult, features: StepFeatures, seconds: float
) -> float:
    """min over D of (T(D extra drafts) - T(floors)) / D, at D = 1, the most drafts, and the
    D on either side of every row knot (the ends of the step time's linear pieces)."""
    most = sum(max(o.cap for o in options) - k for options, k in zip(problem.options, floors.ks))
    rows = features.num_batched_tokens
    ds = {1, most} | {knot - rows + i for knot in ROW_KNOTS for i in (0, 1)}
    predict = problem.cost_model.predict
    return max(
        0.0,
        min(
            (predict(features.with_drafts(d, 0)) - seconds) / d
            for d in ds
            if 1 <= d <= max(1, most)
        ),
    )


def _one_request(problem: SearchProblem) -> SearchResult:
    """One request (batch 1, the common interactive case): every (option, k) up to the first k
    past which no longer chain can win, brute force; the general search costs several times
    more here and finds the same plan."""
    best = None
    for pick, option in enumerate(problem.options[0]):
        most = 1.0 + option.cumulative[option.cap]  # no longer draft of it emits more
        for k in range(option.floor, option.cap + 1):
            if not problem.fits((k,)):
                break
            result = problem.evaluate((k,), (pick,))
            if best is None or result.goodput > best.goodput * (1.0 + 1e-12):
                best = result
            # Step time never falls as k grows (theta >= 0): once even every draft's gain over
            # this k's seconds cannot beat the best, no longer chain can.
            if most / result.predicted_seconds <= best.goodput * (1.0 + 1e-12):
                break
    return best if best is not None else problem.evaluate((problem.options[0][0].floor,))


def _max_draft_cap(problem: SearchProblem) -> int:
    caps = (o.cap for options in problem.options for o in options if problem.runs_draft(o))
    return max(caps, default=0)


def _uniform_picks(problem: SearchProblem) -> list[list[int]]:
    """The options the uniform plans use: each request's model-free option with the best
    first gain, and (when there is one) its draft-model option, whose passes uniform plans
    share across the batch; a request without such an option keeps its first."""
    free, draft = [], []
    for options, flags in zip(problem.options, problem.draft_flags):
        ranked = sorted((-o.cumulative[min(1, o.cap)], i) for i, o in enumerate(options))
        free.append(next((i for _, i in ranked if not flags[i]), 0))
        draft.append(next((i for _, i in ranked if flags[i]), 0))
    if not problem.any_draft:
        return [free]
    return [free, draft] if problem.any_free else [draft]


def _best_uniform(problem: SearchProblem, best: SearchResult, picks: list[int]) -> SearchResult:
    """The best m-requests-at-c plan (requests ranked by their first gain), each evaluated in
    O(1) from running totals as the m-th request joins."""
    slots, base, flags = problem.chosen(picks), problem.base, problem.chosen_flags(picks)
    order = sorted(range(len(slots)), key=lambda i: -slots[i].cumulative[min(1, slots[i].cap)])
    floors = [s.floor for s in slots]
    floor_emitted = sum(1.0 + s.cumulative[s.floor] for s in slots)
    floor_cpu = sum(s.propose_seconds for s in slots if s.floor > 0)
    counts = _checked_counts(len(slots))
    for c in range(1, max((s.cap for s in slots), default=0) + 1):
        ks, emitted, cpu = list(floors), floor_emitted, floor_cpu
        drafts, spec = sum(floors), sum(1 for k in floors if k > 0)
        steps = max((k for k, draft in zip(floors, flags) if draft), default=0)
        for m, i in enumerate(order, start=1):
            slot, k = slots[i], max(slots[i].floor, min(c, slots[i].cap))
            emitted += slot.cumulative[k] - slot.cumulative[ks[i]]
            drafts += k - ks[i]
            spec += (k > 0) - (ks[i] > 0)
            cpu += slot.propose_seconds * ((k > 0) - (ks[i] > 0))
            if k > 0 and flags[i] and slot.depths[k - 1] > steps:
                steps = slot.depths[k - 1]
            ks[i] = k
            budget = problem.token_budget
            if budget is not None and base.num_batched_tokens + drafts > budget:
                break
            if m not in counts:
                continue
            features = base.with_drafts(drafts, spec, steps, problem.graphs)
            seconds = problem.cost_model.predict(features) + cpu
            if emitted / seconds > best.goodput * (1.0 + 1e-12):
                best = SearchResult(tuple(ks), seconds, emitted / seconds, tuple(picks))
    return best


def _checked_counts(n: int) -> set[int]:
    """Every m up to 16, then about 1.5x apart: the best m of a large batch is found to within
    a few requests, which the Dinkelbach rounds that follow then settle one by one."""
    counts, m = set(range(1, min(n, 16) + 1)), 16
    while m < n:
        m = min(n, int(m * 1.5))
        counts.add(m)
    return counts


def _dinkelbach(
    problem: SearchProblem, cap: int, start: SearchResult
) -> tuple[list[int], list[int]]:
    """Plans whose draft-model options have every k_i <= cap, by Dinkelbach rounds from the
    goodput of `start`; (ks, picks)."""
    picks = list(start.picks)
    slots = problem.chosen(picks)
    ks = [
        max(s.floor, min(k, cap)) if problem.runs_draft(s) else k for s, k in zip(slots, start.ks)
    ]
    level, best_ks, best_picks, best_goodput = start.goodput, ks, picks, start.goodput
    for _ in range(MAX_ROUNDS):
        costs = _marginal_costs(problem, ks, picks, cap)
        chosen = [
            _best_option(options, flags, cap, level, costs)
            for options, flags in zip(problem.options, problem.draft_flags)
        ]
        new_ks, new_picks = [k for k, _ in chosen], [p for _, p in chosen]
        result = problem.evaluate(new_ks, new_picks)
        if result.goodput > best_goodput:
            best_ks, best_picks, best_goodput = new_ks, new_picks, result.goodput
        if (new_ks, new_picks) == (ks, picks) or result.goodput <= level * (1.0 + 1e-12):
            break
        ks, picks, level = new_ks, new_picks, result.goodput
    return best_ks, best_picks


@dataclass(frozen=True)
class _Costs:
    """Marginal seconds at the current plan: one more draft, and a request's first draft
    with (draft options) or without (model-free options) the draft model's passes."""

    per_token: float
    per_request: float
    per_request_free: float


def _marginal_costs(
    problem: SearchProblem, ks: Sequence[int], picks: Sequence[int], cap: int
) -> _Costs:
    """Seconds of one more draft on a speculating request, and the extra fixed seconds of a
    request's first draft (with the passes of a cap-deep chain paid once when any speculates)."""
    predict, graphs = problem.cost_model.predict, problem.graphs
    features = problem.features(ks, picks)
    seconds = predict(features)
    passes = cap if problem.any_draft else 0
    first = features.with_drafts(1, 1, passes, graphs)
    # The token cost is measured past the first draft, so that while nobody speculates the
    # batch's fixed costs (passes, an eager step) land on the first request, not on every token;
    # the uniform plans in best_lengths cover sharing them across requests.
    per_token = max(0.0, predict(first.with_drafts(1, 0, passes, graphs)) - predict(first))
    per_request = max(0.0, predict(first) - seconds - per_token)
    per_request_free = per_request
    if passes and problem.any_free:
        per_request_free = max(
            0.0, predict(features.with_drafts(1, 1, 0, graphs)) - seconds - per_token
        )
    return _Costs(per_token, per_request, per_request_free)


def _best_option(
    options: Sequence[SearchSlot], flags: Sequence[bool], cap: int, level: float, costs: _Costs
) -> tuple[int, int]:
    """(k, option index) maximising E(k) - level * seconds(k) over the slot's options."""
    if len(options) == 1:
        limit = min(cap, options[0].cap) if flags[0] else options[0].cap
        return _best_k(options[0], limit, level, costs.per_token, costs.per_request)[0], 0
    best_k, best_pick, best_value = options[0].floor, 0, -float("inf")
    for pick, (slot, draft) in enumerate(zip(options, flags)):
        limit = min(cap, slot.cap) if draft else slot.cap
        fixed = (costs.per_request if draft else costs.per_request_free) + slot.propose_seconds
        k, value = _best_k(slot, limit, level, costs.per_token, fixed)
        if value > best_value:
            best_k, best_pick, best_value = k, pick, value
    return best_k, best_pick


def _best_k(
    slot: SearchSlot, cap: int, level: float, per_token: float, per_request: float
) -> tuple[int, float]:
    """argmax over k in [floor, cap] of E(k) - level * (per_token * k + per_request * [k > 0]),
    and its value. Gains that never increase make E(k) - level * per_token * k concave past
    k = 0: its best k > 0 is the number of gains above level * per_token, clamped."""
    if slot.negated is not None:
        return _best_k_concave(slot, cap, level * per_token, level * per_request)
    best_k, best_value = slot.floor, -float("inf")
    for k in range(slot.floor, cap + 1):
        cost = level * (per_token * k + (per_request if k > 0 else 0.0))
        value = slot.cumulative[k] - cost
        if value > best_value:
            best_k, best_value = k, value
    return best_k, best_value


def _best_k_concave(
    slot: SearchSlot, cap: int, token_cost: float, request_cost: float
) -> tuple[int, float]:
    """_best_k for non-increasing gains (the first best k on ties, as its loop finds)."""
    low = max(1, slot.floor)
    if cap < low:  # only k = 0 is allowed, or nothing is (a floor above the cap)
        return (0, 0.0) if slot.floor == 0 else (slot.floor, -float("inf"))
    k = min(cap, max(low, bisect.bisect_left(slot.negated, -token_cost)))
    value = slot.cumulative[k] - (token_cost * k + request_cost)
    if slot.floor == 0 and value <= 0.0:
        return 0, 0.0
    return k, value


def _within_budget(problem: SearchProblem, ks: list[int], picks: Sequence[int]) -> list[int]:
    """Drop the least valuable drafts until the step fits the token budget."""
    ks, slots = list(ks), problem.chosen(picks)
    while not problem.fits(ks):
        options = [
            (slot.gains[k - 1], i) for i, (slot, k) in enumerate(zip(slots, ks)) if k > slot.floor
        ]
        if not options:
            break
        ks[min(options)[1]] -= 1
    return ks
