"""The search's uniform plans: the m requests with the best first draft each at min(c, cap),
the rest at their floors, for every m and c, with one proposer per request (its best
model-free option, or its draft-model option). Their totals over m and c are running sums
over the ranked requests (arrays [c, m]), the step predicted once per checked m, so a large
batch gets a good starting plan for the Dinkelbach rounds (search.py) in a few vectorised
cost-model calls; a uniform plan already pays the batch-wide fixed costs (a draft-model
pass, verification) that a one-draft-at-a-time search never crosses."""

from __future__ import annotations

import functools

import numpy as np

from engine.speculation.control.search_problem import SearchProblem, SearchResult


def uniform_picks(problem: SearchProblem) -> list[list[int]]:
    """The options the uniform plans use: each request's model-free option with the best
    first gain, and (when there is one) its draft-model option, whose passes uniform plans
    share across the batch; a request without such an option keeps its first."""
    table = problem.table
    first = np.take_along_axis(table.cumulative, np.minimum(1, table.caps)[..., None], axis=2)
    first = first[..., 0]  # [slot, option]: the first draft's gain (-inf: no such option)
    # argmax takes the first of equal gains: the lowest option index, as a stable ranking does
    free = np.where(table.draft, -np.inf, first).argmax(axis=1).tolist()
    draft = np.where(table.draft, first, -np.inf).argmax(axis=1).tolist()
    if not problem.any_draft:
        return [free]
    return [free, draft] if problem.any_free else [draft]


def best_uniform(problem: SearchProblem, best: SearchResult, picks: list[int]) -> SearchResult:
    """The best m-requests-at-c plan (requests ranked by their first gain): the totals of
    every m and c as running sums over the ranked requests (arrays [c, m]), the step
    predicted at the checked m."""
    n, table = len(picks), problem.table
    rows = np.arange(n)
    cumulative, depths = table.cumulative[rows, picks], table.depths[rows, picks]
    floors, caps = table.floors[rows, picks], table.caps[rows, picks]
    cpu, draft = table.seconds[rows, picks], table.draft[rows, picks]
    initial = _uniform_start(cumulative, depths, floors, cpu, draft)
    order = np.argsort(-cumulative[rows, np.minimum(1, caps)], kind="stable")
    cumulative, depths, floors = cumulative[order], depths[order], floors[order]
    caps, cpu, draft = caps[order], cpu[order], draft[order]
    c = np.arange(1, int(caps.max(initial=0)) + 1)[:, None]
    ks = np.maximum(floors, np.minimum(c, caps))  # [c, ranked request]
    joins = (ks > 0) & (floors == 0)
    ranked = np.arange(n)  # broadcast against ks's [c, n] in the gathers
    gained = cumulative[ranked, ks] - cumulative[ranked, floors]
    # Running totals over the first m ranked requests, [c, m] each: the sums in one float
    # cumsum (sequential, as Python adds; the counts are small integers, exact), the passes
    # a running maximum.
    sums = np.empty((4, *ks.shape))
    sums[0], sums[1], sums[2], sums[3] = gained, ks - floors, joins, np.where(joins, cpu, 0.0)
    totals = _running(np.cumsum, sums, np.array(initial[:4], dtype=float)[:, None, None])
    steps = np.where(draft, depths[ranked, ks], 0)
    counts = _checked_counts(n)
    e, n_drafts, n_spec, seconds_cpu = totals[:, :, counts]
    n_steps = _running(np.maximum.accumulate, steps, initial[4])[:, counts]
    seconds = problem.seconds_with(n_drafts, n_spec, n_steps) + (
        seconds_cpu + problem.extra_seconds
    )
    goodputs = e / seconds
    room = problem.token_budget
    fits = n_drafts <= (room - problem.base.num_batched_tokens if room is not None else np.inf)
    for i in range(len(c)):
        if not fits[i, 0]:  # drafts grow with m and c: the counts that fit come first
            break
        goodput = goodputs[i, fits[i]]
        j = int(goodput.argmax())
        if goodput[j] > best.goodput * (1.0 + 1e-12):
            m, plan = counts[j], [0] * n
            for rank, request in enumerate(order.tolist()):
                plan[request] = int(ks[i, rank] if rank < m else floors[rank])
            best = SearchResult(tuple(plan), float(seconds[i, j]), float(goodput[j]), tuple(picks))
    return best


def _uniform_start(cumulative, depths, floors, cpu, draft) -> tuple[float, int, int, float, int]:
    """The uniform plans' totals before any request joins (each at its floor): tokens
    emitted, drafts, speculating requests, proposing seconds, draft-model passes."""
    rows, spec = np.arange(len(floors)), floors > 0
    emitted = sum((1.0 + cumulative[rows, floors]).tolist())  # in order, as the plans add
    passes = depths[rows, floors][draft & spec]
    return (
        emitted,
        int(floors.sum()),
        int(spec.sum()),
        sum(cpu[spec].tolist()),
        int(passes.max(initial=0)),
    )


def _running(accumulate_fn, values: np.ndarray, initial) -> np.ndarray:
    """accumulate_fn along the last axis of `values` ([..., n]), started from `initial`
    (broadcast to [..., 1]): [..., n + 1], entry m the total over the first m (sequential,
    as Python's accumulate adds)."""
    out = np.empty((*values.shape[:-1], values.shape[-1] + 1), np.result_type(values, initial))
    out[..., :1], out[..., 1:] = initial, values
    return accumulate_fn(out, axis=-1, out=out)


@functools.cache
def _checked_counts(n: int) -> np.ndarray:
    """Every m up to 8, then about 1.5x apart (and n), ascending: the best m of a large batch
    is found to within a few requests, which the Dinkelbach rounds that follow then settle one
    by one; each m checked is one cost-model prediction, most of a large batch's planning
    time. (Read-only: one array per n, shared by every plan.)"""
    counts, m = set(range(1, min(n, 8) + 1)), 8
    while m < n:
        m = min(n, int(m * 1.5))
        counts.add(m)
    array = np.array(sorted(counts))
    array.flags.writeable = False
    return array
