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
    Prices,
    SearchProblem,
    SearchResult,
    best_lengths,
    prices_at,
    verify_seconds,
    within_budget,
)


def best_plan(problem: SearchProblem, margin: float = 0.0) -> SearchResult:
    """The search for this problem: by longest chain where steps pad, else best_lengths.
    `margin`: each request's drafts must beat the level by that share (as the policy's best
    responses between searches price them, so that they give back this plan)."""
    if not _by_chain_length(problem):
        return best_lengths(problem)
    floors = [options[0].floor for options in problem.options]
    best = problem.evaluate(floors)
    found = _by_longest(problem, best.goodput, 1.0 + margin)
    if found is not None:
        ks = within_budget(problem, *found)
        result = problem.evaluate(ks, found[1])
        if result.goodput > best.goodput * (1.0 + 1e-12):
            best = result
    return best


def plan_prices(problem: SearchProblem, result: SearchResult) -> Prices:
    """The prices the plan was found at, for best responses between searches: where steps
    pad, its level and the linear costs at its longest chain K, responses held within K (the
    marginal costs at the plan would price a draft past K at the jump in rows, and the
    responses would not be the plan); elsewhere search.prices_at."""
    if not _by_chain_length(problem):
        return prices_at(problem, result)
    longest = max(result.ks, default=0)
    per_token, per_request, _ = _linear_costs(problem, np.array([max(1, longest)]))
    per_request = float(per_request[0])
    if not longest:  # a plan without drafts: a first one pays for verifying at all
        features = problem.features(result.ks, result.picks)
        per_request += verify_seconds(problem.cost_model.predict, features)
    return Prices(result.goodput, float(per_token[0]), per_request, longest)


def _by_chain_length(problem: SearchProblem) -> bool:
    """Steps pad (one request alone has nothing to pad against)."""
    return problem.pads and len(problem.options) > 1


def _by_longest(
    problem: SearchProblem, level: float, markup: float
) -> tuple[list[int], list[int]] | None:
    """(ks, picks) of the best plan over every longest chain K at once (arrays [K, slot,
    option, k]), by Dinkelbach rounds from `level` (drafts priced at level x markup) until
    the plans stop changing; None when no plan beats `level`."""
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
    levels, chosen = np.full(len(longest), level), None
    for _ in range(MAX_ROUNDS):
        value = gains - (markup * levels)[:, None, None, None] * costs  # [K, slot, option, k]
        picks, ks = np.divmod(value.reshape(*value.shape[:2], -1).argmax(2), len(k))
        if (
            chosen is not None
            and np.array_equal(ks, chosen[0])
            and np.array_equal(picks, chosen[1])
        ):
            break  # each K's plan is its requests' best responses at its own goodput
        chosen = ks, picks
        slots = np.arange(ks.shape[1])
        emitted = (1.0 + table.cumulative[slots, picks, ks]).sum(axis=1) + problem.other_tokens
        cpu = np.where(ks > 0, table.seconds[slots, picks], 0.0).sum(axis=1)
        seconds = fixed + per_token * ks.sum(axis=1) + per_request * (ks > 0).sum(axis=1) + cpu
        levels = emitted / (seconds + problem.extra_seconds)
    top = int(levels.argmax())
    if levels[top] <= level:
        return None
    return chosen[0][top].tolist(), chosen[1][top].tolist()


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
