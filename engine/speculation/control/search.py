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
running that for every cap M on the deepest chain (passes = M). The best of those plans and
of the uniform plans (uniform_plans.py: m requests at min(c, cap_i)) is returned; tests
compare it with brute force, fixed costs included.

Two one-pass shortcuts answer the common cases exactly: "no drafts" (_floors_are_best) and
"every request at its cap" (_caps_if_best, tried first when the caller's last plan was that).
A search's answer can also be kept as prices (Prices: its level and marginal costs); a
request's best response at them (best_response) is its k in that plan, which the policy uses
between searches.

Proposer choice (several proposers loaded): a request's slot is one option per proposer, each
with its own gains curve, and it picks the option and k maximising the same per-request value.
Only the options that run the draft model are held to the pass cap M and charged its passes
(once per batch: the draft runs once per depth for every request using it); a model-free
option pays its measured CPU seconds per request (`propose_seconds`) and no passes. M = 0 is
tried too, so the plan without the draft model competes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.speculation.control.search_problem import (
    OptionTable,
    SearchProblem,
    SearchResult,
    SearchSlot,
)
from engine.speculation.control.step_features import ROW_KNOTS, StepFeatures
from engine.speculation.control.uniform_plans import best_uniform, uniform_picks

__all__ = [
    "Prices",
    "SearchProblem",
    "SearchResult",
    "SearchSlot",
    "best_lengths",
    "best_response",
    "prices_at",
    "verify_seconds",
]

MAX_ROUNDS = 8  # Dinkelbach rounds per cap; it converges in 2-3 on real cost models


def best_lengths(problem: SearchProblem) -> SearchResult:
    """The best plan found: uniform plans first (the m requests with the best first draft at
    min(c, cap_i), for every m and c, all with one proposer), then Dinkelbach rounds per cap
    started from the best of them, whose batch-wide fixed costs are already paid, so each
    request's first draft is charged only its own cost."""
    if len(problem.options) == 1:
        return _one_request(problem)
    caps = _caps_if_best(problem) if problem.caps_first else None
    if caps is not None:
        return caps
    floors = [options[0].floor for options in problem.options]
    best = problem.evaluate(floors)
    if _floors_are_best(problem, best):
        return best
    best = best_uniform(problem, best, uniform_picks(problem))
    max_cap = max((o.cap for options in problem.options for o in options), default=0)
    if problem.any_draft:
        lowest = max(0 if problem.any_free else 1, _forced_passes(problem))
        caps = range(lowest, _max_draft_cap(problem) + 1)
    else:
        caps = range(max_cap, max_cap + 1)
    start = best
    for cap in caps:
        found = _dinkelbach(problem, cap, start)
        ks = within_budget(problem, list(found.ks), found.picks)
        result = found if list(found.ks) == ks else problem.evaluate(ks, found.picks)
        if result.goodput > best.goodput * (1.0 + 1e-12) and _keeps_floors(problem, result):
            best = result
    return best


@dataclass(frozen=True)
class Prices:
    """A plan's goodput level and marginal seconds (one more draft, a request's first): at
    the optimum each request's k maximises E(k) - level * seconds(k) at these prices
    (Dinkelbach's condition), so while the batch and the costs stay about the same, the
    prices of the last search give each request its k without searching again."""

    level: float
    per_token: float
    per_request: float
    # A padded graph step's drafts are priced within the plan's longest chain (the rows past
    # it jump: padded_plans.py): responses stay within it. None: no such limit.
    longest: int | None = None


def prices_at(problem: SearchProblem, result: SearchResult) -> Prices:
    cap = max((o.cap for options in problem.options for o in options), default=0)
    costs = _marginal_costs(problem, result.ks, result.picks, cap)
    return Prices(result.goodput, costs.per_token, costs.per_request_free)


def best_response(
    gains: Sequence[float], cap: int, floor: int, prices: Prices, margin: float = 0.0
) -> int:
    """The k in [floor, cap] maximising E(k) - level * (per_token * k + per_request * [k > 0])
    (the first on ties), for gains g(1..cap); `margin`: drafts priced at level * (1 + margin),
    so they must beat the level by that share."""
    level, token, request = prices.level * (1.0 + margin), prices.per_token, prices.per_request
    if prices.longest is not None:
        cap = max(floor, min(cap, prices.longest))
    best_k, best = 0, 0.0
    emitted = 0.0
    for k in range(1, cap + 1):
        emitted += gains[k - 1]
        value = emitted - level * (token * k + request)
        if k <= floor or value > best:
            best_k, best = k, value
    return best_k if best_k >= floor else floor


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
    # A request's own fixed seconds: a first speculating request's, less what verifying at
    # all costs the step (the cost model's verify_steps), which every drafting request shares.
    request = predict(one_more.with_drafts(0, 1)) - predict(one_more)
    request = max(0.0, request - verify_seconds(predict, one_more))
    level = floors.goodput
    for options, floor_k in zip(problem.options, floors.ks):
        for slot in options:
            fixed = (request if floor_k == 0 else 0.0) + slot.propose_seconds
            base = slot.cumulative[floor_k] if floor_k <= slot.cap else 0.0
            for k in range(max(floor_k, slot.floor) + 1, slot.cap + 1):
                if slot.cumulative[k] - base > level * (fixed + (k - floor_k) * token):
                    return False
    return True


def _caps_if_best(problem: SearchProblem) -> SearchResult | None:
    """Every request at its cap, when no plan beats it (where verification is nearly free, as
    on a GPU replaying graphs, the common answer), else None; one pass, as _floors_are_best.
    Only with one option per request and no draft model, so that the step time is g(D) +
    beta * S (D drafts, S speculating requests; every StepFeatures-based model here is of
    that form, plus a cost v of verifying at all). Any other plan drops m drafts and s
    requests: it saves at most m times the most an average dropped draft saves (over every m:
    on each linear piece of g that is largest at an end, so the row knots and the ends
    suffice) plus s * beta, and v where it drops every drafting request, and it loses the
    dropped drafts' gains. If each request's lost gains exceed the cap plan's goodput L times
    its share of that bound, for every lower k, no plan that still verifies reaches L; the
    one plan that does not (every request at its floor, when every floor is 0) is compared
    as it is."""
    if problem.any_draft or any(len(options) > 1 for options in problem.options):
        return None
    slots = [options[0] for options in problem.options]
    caps = [s.cap for s in slots]
    if not problem.fits(caps):
        return None
    result = problem.evaluate(caps)
    drafts, spec = sum(caps), sum(1 for k in caps if k > 0)
    if drafts == 0:
        return None
    token, request = _most_saved_seconds(problem, drafts, spec)
    level = result.goodput
    for slot in slots:
        top = slot.cumulative[slot.cap]
        for k in range(slot.floor, slot.cap):
            saved = (slot.cap - k) * token + ((request + slot.propose_seconds) if k == 0 else 0.0)
            if top - slot.cumulative[k] < level * saved:
                return None
    floors = [slot.floor for slot in slots]
    if not any(floors) and problem.evaluate(floors).goodput > level:
        return None
    return result


def _most_saved_seconds(problem: SearchProblem, drafts: int, spec: int) -> tuple[float, float]:
    """(max over m of (T(D, S) - T(D - m, S)) / m, T(D, S) - T(D, S - 1)) at the cap plan."""
    rows = problem.base.num_batched_tokens + drafts
    ms = {1, drafts} | {rows - knot + i for knot in ROW_KNOTS for i in (0, 1)}
    ms = np.array(sorted(m for m in ms if 1 <= m <= drafts))
    seconds, fewer_requests = problem.seconds_with([drafts, drafts], [spec, spec - 1])
    saved = (seconds - problem.seconds_with(drafts - ms, spec)) / ms
    return max(0.0, float(saved.max())), max(0.0, float(seconds - fewer_requests))


def _least_draft_seconds(
    problem: SearchProblem, floors: SearchResult, features: StepFeatures, seconds: float
) -> float:
    """min over D of (T(D extra drafts) - T(floors)) / D, at D = 1, the most drafts, and the
    D on either side of every row knot (the ends of the step time's linear pieces)."""
    most = sum(max(o.cap for o in options) - k for options, k in zip(problem.options, floors.ks))
    rows = features.num_batched_tokens
    ds = {1, most} | {knot - rows + i for knot in ROW_KNOTS for i in (0, 1)}
    ds = np.array(sorted(d for d in ds if 1 <= d <= max(1, most)))
    spec = features.num_spec_requests - problem.base.num_spec_requests
    floor_drafts = features.num_draft_tokens - problem.base.num_draft_tokens
    more = problem.seconds_with(floor_drafts + ds, spec)
    return max(0.0, float(((more - seconds) / ds).min()))


def _one_request(problem: SearchProblem) -> SearchResult:
    """One request (batch 1, the common interactive case): every (option, k) up to the first k
    past which no longer chain can win, brute force; the general search costs several times
    more here and finds the same plan."""
    best = None
    for pick, option in enumerate(problem.options[0]):
        most = problem.other_tokens + 1.0 + option.cumulative[option.cap]  # no more from longer
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


def _dinkelbach(problem: SearchProblem, cap: int, start: SearchResult) -> SearchResult:
    """The best plan whose draft-model options have every k_i <= cap, by Dinkelbach rounds
    from the goodput of `start` (its plan, those options cut to the cap, when no round beats
    that goodput)."""
    picks, ks = list(start.picks), _cut(problem, start, cap)
    at_start = (ks, picks)
    level, best = start.goodput, None
    for _ in range(MAX_ROUNDS):
        costs = _marginal_costs(problem, ks, picks, cap, share_verify=True)
        new_ks, new_picks = _best_options(problem.table, cap, level, costs)
        result = problem.evaluate(new_ks, new_picks)
        if result.goodput > (start.goodput if best is None else best.goodput):
            best = result
        if (new_ks, new_picks) == (ks, picks) or result.goodput <= level * (1.0 + 1e-12):
            break
        ks, picks, level = new_ks, new_picks, result.goodput
    # Nothing better: the start cut to the cap (its totals usually still held, _totals).
    return best if best is not None else problem.evaluate(*at_start)


def _cut(problem: SearchProblem, plan: SearchResult, cap: int) -> list[int]:
    """The plan's ks with its draft-model options' cut to the pass cap (not below floors)."""
    options, flags = problem.options, problem.draft_flags
    return [
        max(options[i][p].floor, min(k, cap)) if flags[i][p] else k
        for i, (p, k) in enumerate(zip(plan.picks, plan.ks))
    ]


@dataclass(frozen=True)
class _Costs:
    """Marginal seconds at the current plan: one more draft, and a request's first draft
    with (draft options) or without (model-free options) the draft model's passes."""

    per_token: float
    per_request: float
    per_request_free: float


def _marginal_costs(
    problem: SearchProblem,
    ks: Sequence[int],
    picks: Sequence[int],
    cap: int,
    share_verify: bool = False,
) -> _Costs:
    """Seconds of one more draft on a speculating request, and the extra fixed seconds of a
    request's first draft (with the passes of a cap-deep chain paid once when any speculates).
    share_verify: where nobody speculates yet, a first draft is not charged what verifying at
    all adds to the step (verify_seconds), which the drafting requests share: a search round
    then finds plans that pay for it together and keeps them only where their goodput, which
    pays it, is higher. Held prices (prices_at) charge it to a lone request."""
    predict, graphs = problem.cost_model.predict, problem.graphs
    features = problem.features(ks, picks)
    seconds = predict(features)
    passes = cap if problem.any_draft else 0
    first = features.with_drafts(1, 1, passes, graphs)
    # The token cost is measured past the first draft, so that while nobody speculates the
    # batch's fixed costs (passes, an eager step) land on the first request, not on every token;
    # the uniform plans in best_lengths cover sharing them across requests.
    per_token = max(0.0, predict(first.with_drafts(1, 0, passes, graphs)) - predict(first))
    shared = verify_seconds(predict, features) if share_verify else 0.0
    per_request = max(0.0, predict(first) - seconds - per_token - shared)
    per_request_free = per_request
    if passes and problem.any_free:
        per_request_free = max(
            0.0, predict(features.with_drafts(1, 1, 0, graphs)) - seconds - per_token - shared
        )
    return _Costs(per_token, per_request, per_request_free)


def verify_seconds(predict, features: StepFeatures) -> float:
    """What a first speculating request adds to a step of `features` beyond what a second
    one adds: the cost of verifying at all (the cost model's verify_steps). 0 where somebody
    already speculates (it is paid) or the model has no such cost."""
    if features.num_spec_requests:
        return 0.0
    one = features.with_drafts(0, 1)
    two = one.with_drafts(0, 1)
    return max(0.0, 2.0 * predict(one) - predict(features) - predict(two))


def _best_options(
    table: OptionTable, cap: int, level: float, costs: _Costs
) -> tuple[list[int], list[int]]:
    """Per slot, the (k, option) maximising E(k) - level * seconds(k) over its options, all
    slots at once: k in [floor, cap] (draft options also <= the pass cap), seconds(k) =
    per_token * k + (the option's fixed seconds when k > 0). The first best option, then the
    first best k, on ties; a slot with no valid choice keeps its first option's floor."""
    width = table.cumulative.shape[2]
    k, drafting = table.ks
    fixed = np.where(table.draft, costs.per_request, costs.per_request_free) + table.seconds
    cost = level * (costs.per_token * k + fixed[..., None] * drafting)
    value = (table.within(cap) - cost).reshape(len(fixed), -1)
    best = value.argmax(axis=1)
    none = ~np.isfinite(value[np.arange(len(best)), best])
    picks, ks = np.divmod(best, width)
    ks = np.where(none, table.floors[:, 0], ks)
    return ks.tolist(), np.where(none, 0, picks).tolist()


def within_budget(problem: SearchProblem, ks: list[int], picks: Sequence[int]) -> list[int]:
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
