"""Where an engine step's time goes, by the six phases of LLMEngine.step().

Runs --num-requests chat prompts (../shared/data/workload_chat.jsonl, chat template applied)
to completion under --policy with n-gram drafts, timing each phase with a wrapper: plan (the
goodput search), schedule, propose, execute (model + verification), update, observe, and the
output assembly (collect). Prints milliseconds per step, averaged over the run.

    .venv/bin/python benchmarks/step_phases.py --threads 1 --num-requests 8 --policy goodput
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def timed(owner: object, name: str, totals: dict[str, float], key: str) -> None:
    method = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = method(*args, **kwargs)
        totals[key] += time.perf_counter() - start
        return result

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--policy", default="goodput")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    flat = dict(threads=args.threads, speculative_proposer="ngram", spec_policy=args.policy)
    engine = LLMEngine.from_config(EngineConfig.from_flat(flat))
    lines = (DATA / "workload_chat.jsonl").read_text().splitlines()
    for i, line in enumerate(lines[: args.num_requests]):
        messages = [{"role": "user", "content": json.loads(line)["prompt"]}]
        ids = engine.tokenizer.apply_chat_template(messages)
        params = SamplingParams(max_tokens=args.max_tokens, temperature=0, ignore_eos=True)
        engine.add_request(f"r{i}", ids, params)
    totals = dict.fromkeys(("plan", "schedule", "propose", "execute"), 0.0)
    totals.update(dict.fromkeys(("update", "observe", "collect"), 0.0))
    for owner, name, key in (
        (engine.spec, "plan", "plan"),
        (engine.scheduler, "schedule", "schedule"),
        (engine.spec, "propose", "propose"),
        (engine, "_execute", "execute"),
        (engine.scheduler, "update", "update"),
        (engine.spec, "observe", "observe"),
        (engine, "_collect", "collect"),
    ):
        timed(owner, name, totals, key)
    steps, start = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    totals["step"] = time.perf_counter() - start
    print(json.dumps({"args": vars(args), "steps": steps}))
    print(json.dumps({key: round(1e3 * value / steps, 2) for key, value in totals.items()}))


if __name__ == "__main__":
    main()
