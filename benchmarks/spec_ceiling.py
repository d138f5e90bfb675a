"""How fast chain speculation could make one request on this machine: the ceiling that the
measured step costs put on it, for a draft model and for a proposer whose drafts are free.

At batch 1 a step that verifies k drafts emits, with per-token acceptance a (each draft
accepted with probability a while the ones before it were), E(k) = (1 - a^(k+1)) / (1 - a)
tokens (k + 1 at a = 1), and costs V(k + 1), the target's step over k + 1 rows, plus k draft
passes, D(k), where a draft model proposes (0 for the n-gram proposer). Its speedup over
decoding is E(k) T / (V(k + 1) + D(k)), T the one-row step. The best k at a = 1 is the
ceiling: no proposer of that draft cost, however accurate, gets above it on this machine and
these kernels. The last column prices verification at one row's cost whatever its rows (no
kernel can do better), so what it leaves is the draft model's own bound. The costs are
measured here, in one process, the shapes taking turns, medians: the target's synthetic step
(engine/runner/step_timer.py) over 1..K rows at one context, and the same steps with the draft
model's passes (its own KV and catch-up excluded: every pass reads one token).

    .venv/bin/python benchmarks/spec_ceiling.py --rounds 5
    .venv/bin/python benchmarks/spec_ceiling.py --weights gguf-int8   # int8 activations
    .venv/bin/python benchmarks/spec_ceiling.py --draft-vocab 32768   # the draft's head cut

Prints the measured costs relative to T, then for each acceptance the best k and its speedup,
with and without the draft model's passes.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
from collections.abc import Sequence
from pathlib import Path

from engine.speculation.control.acceptance import expected_emitted

PAIR = Path("~/.cache/goodspeed/models/qwen-pair").expanduser()
TARGET = PAIR / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = PAIR / "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
ACCEPTANCES = (0.8, 0.9, 0.95, 1.0)


def best_chain(verify: Sequence[float], draft_pass: float, acceptance: float) -> tuple[int, float]:
    """(k, speedup over decoding) of the best chain length: verify[m - 1] is a step over m
    rows relative to the one-row step (verify[0] == 1), draft_pass one draft pass relative to
    it (0: free drafts). k = 0 (no speculation) is 1.0 by definition."""
    best = (0, 1.0)
    for k in range(1, len(verify)):
        speedup = expected_emitted(acceptance, k) / (verify[k] + k * draft_pass)
        if speedup > best[1]:
            best = (k, speedup)
    return best


def measure(args: argparse.Namespace) -> tuple[list[float], float, float]:
    """(the step over 1..max_rows rows relative to one row, one draft pass relative to one
    row, the one-row step in seconds), medians over the rounds."""
    import torch

    from engine.config import EngineConfig
    from engine.front.llm import LLM
    from engine.runner.step_timer import StepTimer

    flat = dict(
        model=args.target,
        threads=args.threads,
        thread_policy="static",
        weights=args.weights,
        speculative_proposer="draft",
        draft_model=args.draft,
        spec_policy="fixed:1",
        spec_profile_seconds=0,
        draft_vocab=args.draft_vocab,
    )
    llm = LLM(config=EngineConfig.from_flat(flat))
    torch.set_num_threads(args.threads)
    engine = llm.engine
    timer = StepTimer(engine.runner, engine.scheduler.block_manager)
    passes = engine.spec.proposer.time_passes  # the draft model's passes, as propose runs them
    ctx = args.context
    cases = [("rows", m) for m in range(1, args.max_rows + 1)]
    cases.append(("draft", args.draft_passes))
    seconds: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
    for case in cases:  # a warm-up of each shape
        _time_case(timer, passes, ctx, case)
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(cases)
        rng.shuffle(order)
        for case in order:
            seconds[case].append(_time_case(timer, passes, ctx, case))
    median = {case: statistics.median(values) for case, values in seconds.items()}
    one_row = median[("rows", 1)]
    verify = [median[("rows", m)] / one_row for m in range(1, args.max_rows + 1)]
    # The step over k + 1 rows with its k draft passes, less the same step without them.
    k = args.draft_passes
    draft_pass = (median[("draft", k)] - median[("rows", k + 1)]) / k / one_row
    return verify, draft_pass, one_row


def _time_case(timer, passes, context: int, case: tuple[str, int]) -> float:
    kind, n = case
    if kind == "rows":
        return timer([(context, 1, n - 1)])
    return timer([(context, 1, n)], n, passes)


def report(verify: Sequence[float], draft_pass: float, one_row: float) -> str:
    lines = [f"one-row step {one_row * 1e3:.1f} ms; a draft pass {draft_pass:.3f} of it"]
    lines.append(
        "step over m rows / one row: " + " ".join(f"{m + 1}:{v:.2f}" for m, v in enumerate(verify))
    )
    lines.append(
        "| acceptance | free drafts: best k, speedup | draft model | draft model, "
        "verification free |"
    )
    lines.append("|---|---|---|---|")
    free_rows = [1.0] * len(verify)  # a step over any rows costs one row's: no kernel does better
    for acceptance in ACCEPTANCES:
        cells = [
            best_chain(verify, 0.0, acceptance),
            best_chain(verify, draft_pass, acceptance),
            best_chain(free_rows, draft_pass, acceptance),
        ]
        row = " | ".join(f"{k}, {speedup:.2f}x" for k, speedup in cells)
        lines.append(f"| {acceptance:.2f} | {row} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(TARGET))
    parser.add_argument("--draft", default=str(DRAFT))
    parser.add_argument("--weights", default="auto", help="the target's (auto: int16)")
    parser.add_argument("--draft-vocab", type=int, default=0, help="0: the whole vocabulary")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=400)
    parser.add_argument("--max-rows", type=int, default=17)
    parser.add_argument("--draft-passes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not 1 <= args.draft_passes < args.max_rows:
        parser.error("--draft-passes must be in 1..max_rows - 1 (its step is timed without them)")
    verify, draft_pass, one_row = measure(args)
    print(report(verify, draft_pass, one_row))
    print(
        f"context {args.context}, threads {args.threads}, weights {args.weights}, "
        f"draft vocab {args.draft_vocab or 'whole'}"
    )
    print(f"load {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
