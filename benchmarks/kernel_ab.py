"""Two builds of the native CPU kernels on the same weights, interleaved: A/B of a kernel change.

Builds are directories of the kernel cache named by their source hash (kernels/cpu/build.py);
build an old version by checking it out and running `make kernels` (or importing load_native)
once. Times every linear layer of the model's body (30 x [qkv, o, gate_up, down] for SmolLM2)
and its head, at each M, for each build in turn, twice; median of --reps calls per figure.

    .venv/bin/python benchmarks/kernel_ab.py --a a2a3ff58742fac32 --b 291fad5d866bd6cc --threads 1

`--act-a` / `--act-b` pick each side's activation arithmetic (float32 | int8), so one build
against itself compares the two: `--a H --b H --act-b int8`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.models.linear import QuantLinear  # noqa: E402
from kernels.cpu import ACTIVATIONS  # noqa: E402
from kernels.cpu.build import DEFAULT_CACHE  # noqa: E402
from kernels.cpu.build import load_build as cached_build  # noqa: E402


def load_build(source_hash: str):
    module = cached_build(source_hash)
    if module is None:
        sys.exit(f"no kernel build {source_hash} in {DEFAULT_CACHE}")
    return module


def time_layers(ops, runs, rows: int, reps: int, act: str) -> float:
    """Median ms of one pass over `runs` (a layer's WeightRuns) at `rows` rows: the packed tiles
    in the integer modes, the blocks as stored in float32 (as QuantLinear calls them)."""
    xs = [torch.randn(rows, run.in_features) for run in runs]
    outs = [torch.empty(rows, run.out_features) for run in runs]
    tiles = [None if act == "float32" else run.tiles() for run in runs]
    blocks = [run.blocks().data if act == "float32" else None for run in runs]
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for run, x, out, packed, data in zip(runs, xs, outs, tiles, blocks, strict=True):
            ops.qlinear_out(x, data, run.qtype, None, out, 0, ACTIVATIONS[act], packed)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a", required=True, help="source hash of build A (the baseline)")
    parser.add_argument("--b", required=True, help="source hash of build B")
    parser.add_argument("--act-a", choices=list(ACTIVATIONS), default="float32")
    parser.add_argument("--act-b", choices=list(ACTIVATIONS), default="float32")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 5, 8, 16])
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    builds = {
        "A": (load_build(args.a), args.act_a),
        "B": (load_build(args.b), args.act_b),
    }
    llm = LLM(config=EngineConfig.from_flat({"model": args.model, "kv_cache_memory": "64MiB"}))
    model = llm.engine.runner.model
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    parts = {
        "body": [run for m in layers if m is not model.lm_head for run in m.runs],
        "head": list(model.lm_head.runs) if model.lm_head in layers else [],
    }
    print(
        f"threads {args.threads}; ms per pass, A = {args.a} {args.act_a}, "
        f"B = {args.b} {args.act_b}, two rounds"
    )
    print("| M | part | A | B | A | B | B / A |")
    print("|---|---|---|---|---|---|---|")
    for rows in args.rows:
        for part, weights in parts.items():
            if not weights:
                continue
            times = {"A": [], "B": []}
            for _ in range(2):
                for name, (ops, act) in builds.items():
                    times[name].append(time_layers(ops, weights, rows, args.reps, act))
            a, b = times["A"], times["B"]
            ratio = statistics.mean(b) / statistics.mean(a)
            print(
                f"| {rows} | {part} | {a[0]:.2f} | {b[0]:.2f} | {a[1]:.2f} | {b[1]:.2f} | {ratio:.2f} |"
            )


if __name__ == "__main__":
    main()
