"""The goodput policy's plans over random scenarios, hashed: a fingerprint to check that a
change to the planning code (the search, the options, the cost model's predictions) changed no
plan, only its speed.

Each scenario draws a batch (1-64 requests), one to three proposers, a k of 2-6, CPU-like step
costs (with a jump past 5 rows) or GPU-like ones (with and without graphs), a token budget,
offers and kinds, catch-up tokens and an exploration interval, seeds the estimates, then plans
--plans times with random outcomes and step times fed back. Every plan, the chosen proposer
and kind per request, the expected acceptance each plan records and the predicted step go
into the hash. The planning time the policy measures feeds its objective, so it is pinned to
fixed values here.

    .venv/bin/python benchmarks/plan_fingerprint.py
    PYTHONPATH=/tmp/base .venv/bin/python /tmp/base/benchmarks/plan_fingerprint.py

--each prints one hash per scenario, to find the scenarios where two trees differ.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.plan_time import gpu_seconds  # noqa: E402
from engine.request import SpecState  # noqa: E402
from engine.speculation.control.cost_model import OnlineLinearCostModel  # noqa: E402
from engine.speculation.control.goodput import GoodputPolicy  # noqa: E402
from engine.speculation.control.policy import SpecCandidate, SpecResult  # noqa: E402
from engine.speculation.control.step_features import StepFeatures, profile_grid  # noqa: E402
from kernels.cuda_graphs import DEFAULT_BATCH_SIZES  # noqa: E402
from kernels.graph_shapes import NO_GRAPHS, GraphShapes  # noqa: E402

PROPOSER_SETS = [("ngram",), ("draft",), ("ngram", "recycle", "draft"), ("ngram", "recycle")]


def cpu_seconds(f: StepFeatures) -> float:
    """A CPU-like step, with a jump past 5 rows (the few-row matmul path ends there)."""
    jump = 0.015 if f.num_batched_tokens > 5 else 0.0
    return (
        0.02
        + 4e-4 * f.num_batched_tokens
        + 4e-3 * f.num_draft_steps
        + 1e-3 * f.num_spec_requests
        + 3e-5 * f.num_catchup_tokens
        + jump
    )


def scenario_hash(seed: int, num_plans: int) -> str:
    rng = random.Random(seed)
    names = rng.choice(PROPOSER_SETS)
    choice, draft = len(names) > 1, "draft" in names
    k = rng.randint(2, 6)
    costs = rng.choice([cpu_seconds, gpu_seconds])
    graphs = NO_GRAPHS
    if costs is gpu_seconds and rng.random() < 0.5:
        graphs = GraphShapes(DEFAULT_BATCH_SIZES, 1 + k)
    model = OnlineLinearCostModel()
    grid = profile_grid(max_draft_tokens=k, draft_model=draft, graphs=graphs)
    model.fit([(f, costs(f)) for f in grid])
    policy = GoodputPolicy(
        model,
        k,
        draft_model=draft,
        proposers=names if choice else (),
        graphs=graphs,
        token_budget=rng.choice([None, None, 64, 200]),
        explore_interval=rng.choice([4, 16, 64]),
        propose_seconds={"ngram": 1e-5, "recycle": 2e-5} if choice else None,
    )
    records = {f"r{i}": SpecState() for i in range(rng.choice([1, 2, 3, 5, 8, 16, 32, 64]))}
    for request_id, record in records.items():
        for name in names:
            if rng.random() < 0.8:
                result = SpecResult(
                    request_id, k, rng.randint(0, k), name if choice else "", spec=record
                )
                policy.observe([result], StepFeatures(), 0.0)
    digest = hashlib.sha256()
    for step in range(num_plans):
        candidates = [
            _candidate(rng, request_id, record, k, choice, names)
            for request_id, record in records.items()
        ]
        shapes = [(c.context_len, 1, 0) for c in candidates]
        if rng.random() < 0.2:
            shapes.append((0, rng.randint(1, 100), 0))  # a prefill chunk beside the decodes
        base = StepFeatures.from_shapes(shapes, graphs=graphs)
        policy.plan_seconds = 1e-4 * (step % 3)  # measured in a server: pinned here
        plan = policy.plan(candidates, base)
        digest.update(repr(sorted(plan.items())).encode())
        digest.update(
            repr([(c.spec.proposer, c.spec.kind, c.spec.expected) for c in candidates]).encode()
        )
        digest.update(repr(policy.last_predicted_step_time).encode())
        results = [
            SpecResult(
                request_id,
                drafts,
                rng.randint(0, drafts),
                records[request_id].proposer,
                spec=records[request_id],
                kind=records[request_id].kind,
            )
            for request_id, drafts in plan.items()
        ]
        policy.observe(results, base, costs(base) * (1 + 0.1 * rng.random()))
    return digest.hexdigest()


def _candidate(
    rng: random.Random, request_id: str, record: SpecState, k: int, choice: bool, names
) -> SpecCandidate:
    offers = {}
    if choice and "ngram" in names and rng.random() < 0.7:
        offers["ngram"] = (rng.randint(0, k), f"n{rng.randint(1, 3)}")
    return SpecCandidate(
        request_id,
        rng.randint(10, 900),
        rng.randint(0, k),
        record,
        num_catchup_tokens=rng.choice([0, 0, 1, 40]),
        offers=offers,
        num_remaining_tokens=rng.choice([0, 50, 300]),
    )


def fingerprint(num_scenarios: int, num_plans: int, each: bool = False) -> str:
    digest = hashlib.sha256()
    for seed in range(num_scenarios):
        one = scenario_hash(seed, num_plans)
        if each:
            print(f"scenario {seed:4d}  {one}")
        digest.update(one.encode())
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", type=int, default=150)
    parser.add_argument("--plans", type=int, default=12, help="plans per scenario")
    parser.add_argument("--each", action="store_true", help="a hash per scenario too")
    args = parser.parse_args()
    total = fingerprint(args.scenarios, args.plans, args.each)
    print(f"{args.scenarios} scenarios x {args.plans} plans: {total}")


if __name__ == "__main__":
    main()
