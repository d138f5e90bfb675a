"""Where a decode step's time goes: matmul kernels vs everything else.

Runs `--rows` greedy requests to their decode phase, then profiles `--steps` engine steps with
torch.profiler and prints the wall time per step, the time inside the linear kernels (our
quantized `goodspeed_cpu` ops or aten's mm/addmm/linear) and the top other ops. The non-matmul
time is the step's wall time minus its matmul time: Python, small ops, attention, sampling.

    .venv/bin/python benchmarks/profile_step.py --weights gguf --threads 2
    .venv/bin/python benchmarks/profile_step.py --weights float32 --rows 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.models.linear import QuantLinear
from engine.sampling_params import SamplingParams

MATMUL_KEYS = ("goodspeed_cpu::", "aten::mm", "aten::addmm", "aten::bmm")


def label_quantized_calls() -> None:
    """The native kernels are pybind calls, invisible to the profiler: give them a label."""
    forward = QuantLinear.forward

    def labelled(self, x):
        with torch.profiler.record_function("goodspeed_cpu::qlinear"):
            return forward(self, x)

    QuantLinear.forward = labelled


def start_decoding(llm: LLM, rows: int, steps: int) -> None:
    engine = llm.engine
    for i in range(rows):
        prompt = llm.tokenizer.encode(f"Story {i}: the history of the printing press")
        params = SamplingParams(max_tokens=4 * steps + 8, temperature=0, ignore_eos=True)
        engine.add_request(f"p{i}", prompt, params)
    while (
        any(r.num_output_tokens == 0 for r in engine.scheduler.running) or engine.scheduler.waiting
    ):
        engine.step()


def step_times(llm: LLM, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        llm.engine.step()
        times.append(time.perf_counter() - t0)
    return times


def profile(llm: LLM, steps: int) -> dict:
    label_quantized_calls()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step_times(llm, steps)
    events = prof.key_averages()
    matmul_us = sum(e.self_cpu_time_total for e in events if e.key.startswith(MATMUL_KEYS))
    others = sorted(
        (e for e in events if not e.key.startswith(MATMUL_KEYS)),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    return {
        "matmul_ms_per_step": round(matmul_us / steps / 1e3, 2),
        "top_other_ops_ms_per_step": [
            (e.key, round(e.self_cpu_time_total / steps / 1e3, 3), e.count // steps)
            for e in others[:15]
        ],
        "ops_per_step": sum(e.count for e in events) // steps,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument(
        "--weights",
        default="auto",
        choices=["auto", "gguf", "gguf-f32", "gguf-int16", "gguf-int8", "float32"],
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--steps", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = {"model": args.model, "threads": args.threads, "weights": args.weights}
    llm = LLM(config=EngineConfig.from_flat(config))
    start_decoding(llm, args.rows, args.steps)
    step_times(llm, 4)  # warm
    wall = step_times(llm, args.steps)
    result = {"args": vars(args), "step_ms_median": round(1e3 * statistics.median(wall), 2)}
    result.update(profile(llm, args.steps))
    result["non_matmul_ms_per_step"] = round(
        result["step_ms_median"] - result["matmul_ms_per_step"], 2
    )
    print(json.dumps({k: v for k, v in result.items() if k != "top_other_ops_ms_per_step"}))
    for row in result["top_other_ops_ms_per_step"]:
        print(*row)


if __name__ == "__main__":
    main()
