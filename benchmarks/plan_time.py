"""Milliseconds per GoodputPolicy.plan() (the goodput search) by batch size and proposers,
and their share of the step time the plan predicts.

The cost model is an OnlineLinearCostModel fitted on synthetic step times over the start-up
profile grid (draft passes included), each request has its own acceptance per proposer, and
every plan is timed whole (slots, exploration, search), as the engine runs it each step, in
CPU time of this process (the median over --repeats runs of --rounds plans each, and the
least of them: on a shared machine the least disturbed run), the heap
frozen first as the server's is, so that no full collector scan lands in a plan.

    .venv/bin/python benchmarks/plan_time.py --requests 8 32 64 --k 4
    .venv/bin/python benchmarks/plan_time.py --requests 1 2 4 8 16 --costs gpu
    .venv/bin/python benchmarks/plan_time.py --requests 16 64 --costs gpu --graphs --proposers ngram

--graphs: chains replayed as CUDA graphs padded to the longest (padded_plans.py), rows priced
as the graph computes them.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.request import SpecState  # noqa: E402
from engine.speculation.control.cost_model import OnlineLinearCostModel  # noqa: E402
from engine.speculation.control.goodput import GoodputPolicy  # noqa: E402
from engine.speculation.control.policy import SpecCandidate, SpecResult  # noqa: E402
from engine.speculation.control.step_features import StepFeatures, profile_grid  # noqa: E402
from kernels.cuda_graphs import DEFAULT_BATCH_SIZES  # noqa: E402
from kernels.graph_shapes import NO_GRAPHS, GraphShapes  # noqa: E402

PROPOSER_SETS = {
    "ngram": ("ngram",),
    "draft": ("draft",),
    "ngram,recycle,draft": ("ngram", "recycle", "draft"),
}


def cpu_seconds(f: StepFeatures) -> float:
    """A CPU-like step: 20 ms + 0.4 ms per row + 4 ms per draft pass + 1 ms per verify."""
    return (
        0.02 + 4e-4 * f.num_batched_tokens + 4e-3 * f.num_draft_steps + 1e-3 * f.num_spec_requests
    )


def gpu_seconds(f: StepFeatures) -> float:
    """A GPU-like step (SmolLM2 replayed on an H200, docs/benchmarks.md §4): 1.7 ms + 5 µs per
    row + 0.3 ms per draft pass + 0.05 ms per verifying request."""
    rows = f.num_graph_rows or f.num_batched_tokens
    return 1.7e-3 + 5e-6 * rows + 3e-4 * f.num_draft_steps + 5e-5 * f.num_spec_requests


COSTS = {"cpu": cpu_seconds, "gpu": gpu_seconds}


def fitted_model(k: int, costs: str = "cpu", graphs: GraphShapes = NO_GRAPHS):
    model = OnlineLinearCostModel()
    grid = profile_grid(max_draft_tokens=k, draft_model=True, graphs=graphs)
    model.fit([(f, COSTS[costs](f)) for f in grid])
    return model


def time_plans(
    names: tuple[str, ...],
    num_requests: int,
    k: int,
    rounds: int,
    costs: str = "cpu",
    graphs: GraphShapes = NO_GRAPHS,
) -> tuple[float, float]:
    """(ms per plan, the plan's predicted step in ms)."""
    rng = random.Random(0)
    policy = GoodputPolicy(
        fitted_model(k, costs, graphs),
        k,
        draft_model="draft" in names,
        proposers=names if len(names) > 1 else (),
        graphs=graphs,
    )
    records = {f"r{i}": SpecState() for i in range(num_requests)}
    for request_id, record in records.items():
        for name in names:
            accepted = rng.randint(0, k)
            result = SpecResult(request_id, k, accepted, name, spec=record)
            policy.observe([result], StepFeatures(), 0.0)
    candidates = [SpecCandidate(r, 500, k, record) for r, record in records.items()]
    base = StepFeatures.from_shapes([(500, 1, 0)] * num_requests, graphs=graphs)
    gc.collect()
    gc.freeze()  # as the server freezes its start-up heap (server/cli.py): no 0.1 s full scans
    start = time.process_time()  # CPU time: robust to other processes sharing the cores
    for _ in range(rounds):
        policy.plan(candidates, base)
    ms = (time.process_time() - start) / rounds * 1e3
    return ms, (policy.last_predicted_step_time or 0.0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--costs", choices=sorted(COSTS), default="cpu", help="synthetic step times"
    )
    parser.add_argument("--graphs", action="store_true", help="chains replayed, padded")
    parser.add_argument("--proposers", nargs="+", choices=sorted(PROPOSER_SETS))
    args = parser.parse_args()
    graphs = GraphShapes(DEFAULT_BATCH_SIZES, 1 + args.k) if args.graphs else NO_GRAPHS
    for num_requests in args.requests:
        for label, names in PROPOSER_SETS.items():
            if args.proposers and label not in args.proposers:
                continue
            runs = [
                time_plans(names, num_requests, args.k, args.rounds, args.costs, graphs)
                for _ in range(args.repeats)
            ]
            ms = statistics.median(ms for ms, _ in runs)
            least = min(ms for ms, _ in runs)  # the least disturbed run, on a shared machine
            step = runs[0][1]
            print(
                f"{num_requests:4d} requests  {label:22s} {ms:7.3f} ms/plan"
                f"  predicted step {step:6.1f} ms  ({100 * ms / step:4.1f}%)"
                f"  min {least:7.3f} ms"
            )


if __name__ == "__main__":
    main()
