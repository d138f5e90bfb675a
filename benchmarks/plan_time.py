"""Milliseconds per GoodputPolicy.plan() (the goodput search) by batch size and proposers.

The cost model is an OnlineLinearCostModel fitted on synthetic step times over the start-up
profile grid (draft passes included), each request has its own acceptance per proposer, and
every plan is timed whole (slots, exploration, search), as the engine runs it each step, in
CPU time of this process (the best of --repeats runs).

    .venv/bin/python benchmarks/plan_time.py --requests 8 32 --k 4
"""

from __future__ import annotations

import argparse
import random
import time

from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.goodput import GoodputPolicy
from engine.speculation.control.policy import SpecCandidate, SpecResult
from engine.speculation.control.step_features import StepFeatures, profile_grid

PROPOSER_SETS = {
    "ngram": ("ngram",),
    "draft": ("draft",),
    "ngram,recycle,draft": ("ngram", "recycle", "draft"),
}


def synthetic_seconds(f: StepFeatures) -> float:
    """A CPU-like step: 20 ms + 0.4 ms per row + 4 ms per draft pass + 1 ms per verify."""
    return (
        0.02 + 4e-4 * f.num_batched_tokens + 4e-3 * f.num_draft_steps + 1e-3 * f.num_spec_requests
    )


def fitted_model(k: int) -> OnlineLinearCostModel:
    model = OnlineLinearCostModel()
    grid = profile_grid(max_draft_tokens=k, draft_model=True)
    model.fit([(f, synthetic_seconds(f)) for f in grid])
    return model


def time_plans(names: tuple[str, ...], num_requests: int, k: int, rounds: int) -> float:
    rng = random.Random(0)
    policy = GoodputPolicy(
        fitted_model(k),
        k,
        draft_model="draft" in names,
        proposers=names if len(names) > 1 else (),
    )
    ids = [f"r{i}" for i in range(num_requests)]
    for request_id in ids:
        for name in names:
            accepted = rng.randint(0, k)
            policy.observe([SpecResult(request_id, k, accepted, name)], StepFeatures(), 0.0)
    candidates = [SpecCandidate(request_id, 500, k) for request_id in ids]
    base = StepFeatures.from_shapes([(500, 1, 0)] * num_requests)
    start = time.process_time()  # CPU time: robust to other processes sharing the cores
    for _ in range(rounds):
        policy.plan(candidates, base)
    return (time.process_time() - start) / rounds * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for num_requests in args.requests:
        for label, names in PROPOSER_SETS.items():
            runs = (
                time_plans(names, num_requests, args.k, args.rounds) for _ in range(args.repeats)
            )
            ms = min(runs)
            print(f"{num_requests:4d} requests  {label:22s} {ms:7.3f} ms/plan")


if __name__ == "__main__":
    main()
