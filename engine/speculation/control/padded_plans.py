"""The goodput search where verification steps replay padded CUDA graphs (a GPU runner with
FlashInfer, kernels/graph_shapes.py): the runner pads every request to the step's longest
query, so a plan's rows follow its longest chain K, not its total drafts. One request
verifying 4 drafts beside 15 decodes runs 16 x 5 rows; priced by its 19 real rows, such a
plan looked nearly free, and goodput lost to no speculation on chat at 16 requests on an
H200 (docs/benchmarks.md §4e-4f).

At a fixed K the rows are fixed and the rest of the step time is linear in drafts and
speculating requests, so each request's best k <= K at a goodput level is its best response
(search.best_options), and Dinkelbach rounds settle the level. The best plan over K = 1..cap
and the floors is returned; with one request there is no padding, and search.best_lengths
answers as everywhere else.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from engine.speculation.control.search import (
    MAX_ROUNDS,
    Costs,
    SearchProblem,
    SearchResult,
    best_lengths,
    best_options,
    within_budget,
)


def best_plan(problem: SearchProblem) -> SearchResult:
    """The search for this problem: by longest chain where steps pad, else best_lengths."""
    if not problem.pads or len(problem.options) == 1:
        return best_lengths(problem)
    floors = [options[0].floor for options in problem.options]
    best = problem.evaluate(floors)
    table = problem.table
    for longest in range(max(1, max(floors)), int(table.caps.max(initial=0)) + 1):
        result = _at_longest(problem, longest, best)
        if result.goodput > best.goodput * (1.0 + 1e-12):
            best = result
    return best


def _at_longest(problem: SearchProblem, longest: int, start: SearchResult) -> SearchResult:
    """The best plan whose chains are at most `longest`, by Dinkelbach rounds from the
    goodput of `start`."""
    table = dataclasses.replace(problem.table, caps=np.minimum(problem.table.caps, longest))
    costs = _costs_at(problem, longest)
    level, best = start.goodput, None
    for _ in range(MAX_ROUNDS):
        ks, picks = best_options(table, longest, level, costs)
        ks = within_budget(problem, ks, picks)
        result = problem.evaluate(ks, picks)
        if best is None or result.goodput > best.goodput:
            best = result
        if result.goodput <= level * (1.0 + 1e-12):
            break
        level = result.goodput
    return best


def _costs_at(problem: SearchProblem, longest: int) -> Costs:
    """A draft's and a speculating request's seconds with the step padded to 1 + longest rows
    a request: the differences of three plans of that padding."""
    predict, base, graphs = problem.cost_model.predict, problem.base, problem.graphs
    one = predict(base.with_drafts(longest, 1, 0, graphs, longest))
    more = predict(base.with_drafts(longest + 1, 1, 0, graphs, longest))
    other = predict(base.with_drafts(longest + 1, 2, 0, graphs, longest))
    per_token = max(0.0, more - one)
    per_request = max(0.0, other - more)
    return Costs(per_token, per_request, per_request)
