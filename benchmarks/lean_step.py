"""The lean CPU decode step against the PyTorch one, in one process, interleaved.

Two engines on the same model: `torch` (reference attention: gather + SDPA; RMSNorm, RoPE,
SiLU·mul as PyTorch ops) and `lean` (kernels/cpu/paged_attention.py attention and the fused ops of
kernels/fused.py). Both run the same native quantized linears. Each round times `--steps`
engine steps of each with `--rows` greedy requests decoding; the time inside the linear
kernels is measured with a timer around each QuantLinear call, so
non-matmul = step - linears (Python, small ops, attention, sampling).

    .venv/bin/python benchmarks/lean_step.py --threads 2 --rows 1 --rounds 5

`--compare activations`: three lean engines instead, `gguf-f32`, `gguf-int16` and `gguf-int8`
(float32, int16 and int8 activations, kernels/cpu), the same way.

`--compare stack`: the per-op forward (`native_stack_enabled = False`: one native op at a time
from Python) against the native decoder stack (engine/models/native_stack.py), same kernels;
the stack's own timer splits its time by phase (norms, qkv, rope, attention, o, gate_up,
silu_mul, down; ms per step), and `linear_ms` is then the head's alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.profile_step import start_decoding  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.models.linear import QuantLinear  # noqa: E402
from kernels import fused  # noqa: E402

LINEAR_SECONDS = [0.0]


def time_linears() -> None:
    forward = QuantLinear.forward

    def timed(self, x):
        start = time.perf_counter()
        out = forward(self, x)
        LINEAR_SECONDS[0] += time.perf_counter() - start
        return out

    QuantLinear.forward = timed


@contextmanager
def fused_ops(enabled: bool):
    original = fused.native_ops
    if not enabled:
        fused.native_ops = lambda x: None
    try:
        yield
    finally:
        fused.native_ops = original


def measure(llm: LLM, steps: int, lean: bool) -> tuple[float, float, dict]:
    """(median step ms, mean linear ms per step, the stack's ms per step by phase)."""
    times = []
    LINEAR_SECONDS[0] = 0.0
    stack = llm.engine.runner.model.native_stack()
    if stack is not None:
        stack.timings = torch.zeros(len(stack.phase_names), dtype=torch.float64)
    with fused_ops(lean):
        for _ in range(steps):
            start = time.perf_counter()
            llm.engine.step()
            times.append(time.perf_counter() - start)
    phases = {}
    if stack is not None:
        phases = {n: 1e3 * float(t) / steps for n, t in zip(stack.phase_names, stack.timings)}
        stack.timings = None
    return 1e3 * statistics.median(times), 1e3 * LINEAR_SECONDS[0] / steps, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compare", choices=["lean", "activations", "stack"], default="lean")
    parser.add_argument("--weights", default="auto", help="with --compare stack")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = {  # name: (attention backend, weights, lean fused ops)
        "lean": {"torch": ("reference", "auto", False), "lean": ("cpu", "auto", True)},
        "activations": {
            "float32": ("cpu", "gguf-f32", True),
            "int16": ("cpu", "gguf-int16", True),
            "int8": ("cpu", "gguf-int8", True),
        },
        "stack": {"per-op": ("cpu", args.weights, True), "stack": ("cpu", args.weights, True)},
    }[args.compare]
    engines = {}
    for name, (backend, weights, lean) in variants.items():
        flat = {"model": args.model, "threads": args.threads, "attention_backend": backend}
        flat.update(kv_cache_memory="256MiB", weights=weights)
        engines[name] = LLM(config=EngineConfig.from_flat(flat))
        engines[name].engine.runner.model.native_stack_enabled = name != "per-op"
        with fused_ops(lean):
            start_decoding(engines[name], args.rows, args.steps * (args.rounds + 1))
    time_linears()
    results = {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, llm in engines.items():
            results[name].append(measure(llm, args.steps, variants[name][2]))
    summary = {"args": vars(args)}
    for name, rows in results.items():
        step = statistics.median(r[0] for r in rows)
        linears = statistics.median(r[1] for r in rows)
        summary[name] = {
            "step_ms": round(step, 2),
            "linear_ms": round(linears, 2),
            "non_matmul_ms": round(step - linears, 2),
        }
        if rows[0][2]:
            phases = {n: round(statistics.median(r[2][n] for r in rows), 3) for n in rows[0][2]}
            summary[name]["stack_phases_ms"] = phases
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
