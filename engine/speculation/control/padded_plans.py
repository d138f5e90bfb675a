"""The goodput search where verification steps replay padded CUDA graphs (a GPU runner with
FlashInfer, kernels/graph_shapes.py): the runner pads every request to the step's longest
query, so a plan's rows follow its longest chain K, not its total drafts. One request
verifying 4 drafts beside 15 decodes runs 16 x 5 rows; priced by its 19 real rows, such a
plan looked nearly free, and goodput lost to no speculation on chat at 16 requests on an
H200 (docs/benchmarks.md §4e-4f).

At a fixed K the rows are fixed and the rest of the step time is linear in drafts and
speculating requests, so each request's best (option, k <= K) at a goodput level maximises
E(k) - level * seconds(k) on its own, and Dinkelbach rounds settle the level; every K runs at
once as arrays [K, slot, option, k]. The best plan over K = 1..cap and the floors is
returned; with one request there is no padding, and search.best_lengths answers as
everywhere else.
"""

from __future__ import annotations

import numpy as np

from engine.speculation.control.search import (
    MAX_ROUNDS,
    SearchProblem,
    SearchResult,
    best_lengths,
    within_budget,
)


def best_plan(problem: SearchProblem) -> SearchResult:
    """The search for this problem: by longest chain where steps pad, else best_lengths."""
    if not problem.pads or len(problem.options) == 1:
        return best_lengths(problem)
    floors = [options[0].floor for options in problem.options]
    best = problem.evaluate(floors)
    found = _by_longest(problem, best.goodput)
    if found is not None:
        ks = within_budget(problem, *found)
        result = problem.evaluate(ks, found[1])
        if result.goodput > best.goodput * (1.0 + 1e-12):
            best = result
    return best


def _by_longest(problem: SearchProblem, level: float) -> tuple[list[int], list[int]] | None:
    """(ks, picks) of the best plan over every longest chain K at once (arrays [K, slot,
    option, k]), by Dinkelbach rounds from `level`; None when no K is possible."""
    table = problem.table
    longest = np.arange(max(1, int(table.floors.min(axis=1).max())), table.caps.max() + 1)
    if len(longest) == 0:
        return None
    per_token, per_request, fixed = _linear_costs(problem, longest)
    k = np.arange(table.cumulative.shape[2])
    cap = np.minimum(table.caps, longest[:, None, None])[..., None]  # [K, slot, option, 1]
    valid = (k >= table.floors[..., None]) & (k <= cap)
    gains = np.where(valid, table.cumulative, -np.inf)
    costs = per_token[:, None, None, None] * k
    costs = costs + (per_request[:, None, None, None] + table.seconds[..., None]) * (k > 0)
    levels = np.full(len(longest), level)
    best, best_goodput = None, level
    for _ in range(MAX_ROUNDS):
        value = gains - levels[:, None, None, None] * costs  # [K, slot, option, k]
        picks, ks = np.divmod(value.reshape(*value.shape[:2], -1).argmax(2), len(k))
        slots = np.arange(ks.shape[1])
        emitted = (1.0 + table.cumulative[slots, picks, ks]).sum(axis=1)
        cpu = np.where(ks > 0, table.seconds[slots, picks], 0.0).sum(axis=1)
        seconds = fixed + per_token * ks.sum(axis=1) + per_request * (ks > 0).sum(axis=1) + cpu
        goodputs = emitted / (seconds + problem.extra_seconds)
        top = int(goodputs.argmax())
        if goodputs[top] > best_goodput:
            best, best_goodput = (ks[top].tolist(), picks[top].tolist()), float(goodputs[top])
        improved = goodputs > levels * (1.0 + 1e-12)
        if not improved.any():
            break
        levels = np.where(improved, goodputs, levels)
    return best


def _linear_costs(
    problem: SearchProblem, longest: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per longest chain K (the step padded to 1 + K rows a request): seconds per draft, per
    speculating request, and the rest, from three plans of that padding each (K drafts on
    one request, 2K - 1 and 2K on two)."""
    seconds = problem.seconds_with(
        np.concatenate((longest, 2 * longest - 1, 2 * longest)),
        np.repeat([1, 2, 2], len(longest)),
    ).reshape(3, -1)
    one, two_short, two = seconds
    per_token = np.maximum(0.0, two - two_short)
    per_request = np.maximum(0.0, two_short - one - (longest - 1) * per_token)
    return per_token, per_request, one - longest * per_token - per_request
