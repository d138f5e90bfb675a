"""A draft model's batch-1 decode step against its target's, in one process, the two taking
turns (a busy machine slows both alike): ms per token after the first of a 17-token greedy
generation on a 300-token prompt, medians; and the draft's LM head alone.

    .venv/bin/python benchmarks/draft_step_cost.py --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

PAIR = Path("~/.cache/goodspeed/models/qwen-pair").expanduser()
TARGET = PAIR / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = PAIR / "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"
PROMPT = list(range(1000, 1300))
PARAMS = SamplingParams(temperature=0, max_tokens=17, ignore_eos=True)


def engine(path: Path, threads: int) -> LLM:
    flat = {"model": str(path), "threads": threads, "thread_policy": "static"}
    return LLM(config=EngineConfig.from_flat({**flat, "spec_policy": "off"}))


def seconds_per_token(llm: LLM) -> float:
    out = llm.generate([PROMPT], PARAMS, use_tqdm=False)[0]
    return (out.metrics["finished_time"] - out.metrics["first_token_time"]) / 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(TARGET))
    parser.add_argument("--draft", default=str(DRAFT))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    llms = {"target": engine(Path(args.target), args.threads)}
    llms["draft"] = engine(Path(args.draft), args.threads)
    times: dict[str, list[float]] = {name: [] for name in llms}
    for llm in llms.values():
        seconds_per_token(llm)
    for i in range(args.rounds):
        for name in list(llms) if i % 2 == 0 else list(reversed(llms)):
            times[name].append(seconds_per_token(llms[name]))
    target, draft = (statistics.median(times[name]) for name in ("target", "draft"))
    print(f"target {target * 1e3:.1f} ms/token, draft {draft * 1e3:.1f} ({draft / target:.3f})")
    model = llms["draft"].engine.runner.model
    hidden = torch.randn(1, model.config.hidden_size)
    for _ in range(3):
        model.compute_logits(hidden)
    start = time.perf_counter()
    for _ in range(20):
        model.compute_logits(hidden)
    print(f"draft LM head alone {(time.perf_counter() - start) / 20 * 1e3:.2f} ms")
    print(f"load {os.getloadavg()}")


if __name__ == "__main__":
    main()
