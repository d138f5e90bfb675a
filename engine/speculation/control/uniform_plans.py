"""The search's uniform plans: the m requests with the best first draft each at min(c, cap),
the rest at their floors, for every m and c, with one proposer per request (its best
model-free option, or its draft-model option). Their totals over m and c are running sums
over the ranked requests (arrays [pick set, c, m], the sets of picks at once), the step
predicted once per checked m, so a large batch gets a good starting plan for the Dinkelbach
rounds (search.py) in a few vectorised cost-model calls; a uniform plan already pays the
batch-wide fixed costs (a draft-model pass, verification) that a one-draft-at-a-time search
never crosses."""

from __future__ import annotations

import functools

import numpy as np

from engine.speculation.control.search_problem import OptionTable, SearchProblem, SearchResult


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


def best_uniform(
    problem: SearchProblem, best: SearchResult, picks: list[list[int]]
) -> SearchResult:
    """The best m-requests-at-c plan over each set of picks in turn (requests ranked by their
    first gain), or `best`: the totals of every m and c as running sums over the ranked
    requests (arrays [pick set, c, m], every set at once), the step predicted at the checked
    m. A later set's plan replaces an earlier one only when strictly better."""
    n = len(picks[0])
    sets, rows = np.arange(len(picks))[:, None], np.arange(n)
    cumulative, depths, floors, caps, cpu, draft = _picked(problem.table, np.array(picks))
    at_floor = cumulative[sets, rows, floors], depths[sets, rows, floors]
    initial = _uniform_start(*at_floor, floors, cpu, draft, problem.other_tokens)
    order = np.argsort(-cumulative[sets, rows, np.minimum(1, caps)], axis=1, kind="stable")
    # By rank from here: each set's requests in the order they join.
    cumulative, depths, floors, caps, cpu, draft = (
        a[sets, order] for a in (cumulative, depths, floors, caps, cpu, draft)
    )
    c = np.arange(1, int(caps.max(initial=0)) + 1)[:, None]  # a set of lower caps repeats
    ks = np.maximum(floors[:, None], np.minimum(c, caps[:, None]))  # [set, c, rank]
    joins = (ks > 0) & (floors[:, None] == 0)
    at_k = (sets[..., None], rows, ks)  # each set's ranked requests at their k for each c
    # Running totals over the first m ranked requests, [set, c, m] each: the sums in one float
    # cumsum (sequential, as Python adds; the counts are small integers, exact), the passes
    # a running maximum.
    sums = np.empty((4, *ks.shape))
    sums[0] = cumulative[at_k] - cumulative[sets, rows, floors][:, None]
    sums[1], sums[2], sums[3] = ks - floors[:, None], joins, np.where(joins, cpu[:, None], 0.0)
    totals = _running(np.cumsum, sums, np.array(initial[:4])[:, :, None, None])
    steps = np.where(draft[:, None], depths[at_k], 0)
    counts = _checked_counts(n)
    e, n_drafts, n_spec, seconds_cpu = totals[..., counts]
    n_steps = _running(np.maximum.accumulate, steps, initial[4][:, None, None])[..., counts]
    seconds = problem.seconds_with(n_drafts, n_spec, n_steps) + (
        seconds_cpu + problem.extra_seconds
    )
    room = problem.token_budget
    fits = n_drafts <= (room - problem.base.num_batched_tokens if room is not None else np.inf)
    for p, set_picks in enumerate(picks):
        for i in range(len(c)):
            if not fits[p, i, 0]:  # drafts grow with m and c: the counts that fit come first
                break
            goodput = e[p, i, fits[p, i]] / seconds[p, i, fits[p, i]]
            j = int(goodput.argmax())
            if goodput[j] > best.goodput * (1.0 + 1e-12):
                plan = np.empty(n, dtype=np.int64)  # by request: the first m ranked at c
                plan[order[p]] = np.where(rows < counts[j], ks[p, i], floors[p])
                result = float(seconds[p, i, j]), float(goodput[j])
                best = SearchResult(tuple(plan.tolist()), *result, tuple(set_picks))
    return best


def _picked(table: OptionTable, picks: np.ndarray) -> tuple[np.ndarray, ...]:
    """The table's arrays at each set's picked options (picks [set, request]): cumulative and
    depths [set, request, k], floors, caps, CPU seconds and draft flags [set, request]."""
    rows = np.arange(picks.shape[1])
    return (
        table.cumulative[rows, picks],
        table.depths[rows, picks],
        table.floors[rows, picks],
        table.caps[rows, picks],
        table.seconds[rows, picks],
        table.draft[rows, picks],
    )


def _uniform_start(at_floor, depths, floors, cpu, draft, other_tokens) -> tuple[np.ndarray, ...]:
    """Per pick set, the uniform plans' totals before any request joins (each at its floor):
    tokens emitted (from the step's `other_tokens`), drafts, speculating requests, proposing
    seconds, draft-model passes. `at_floor`, `depths`: each request's cumulative gain and
    passes at its floor. The sums sequential (cumsum), in request order, as the plans add."""
    spec = floors > 0
    emitted = np.concatenate([np.full((len(floors), 1), float(other_tokens)), 1.0 + at_floor], 1)
    return (
        np.cumsum(emitted, axis=1)[:, -1],
        floors.sum(axis=1),
        spec.sum(axis=1),
        np.cumsum(np.where(spec, cpu, 0.0), axis=1)[:, -1],
        np.where(draft & spec, depths, 0).max(axis=1, initial=0),
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
