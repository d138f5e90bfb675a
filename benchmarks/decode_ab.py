"""In-process decode tok/s of whichever `engine` package is first on sys.path, so two checkouts
can be compared with the same script (PYTHONPATH=<tree>): B greedy requests, N tokens each,
static threads (or --thread-policy adaptive, the server's default on a CPU), median of R
repetitions after a warm-up; one JSON line.

    for t in /tmp/before /work/main; do PYTHONPATH=$t .venv/bin/python \
        benchmarks/decode_ab.py --batch 16 --tokens 64 --reps 3; done
    .venv/bin/python benchmarks/decode_ab.py --model ~/.cache/goodspeed/models/qwen-pair/\
        qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --tokens 48
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from engine.config import EngineConfig

try:
    from engine.llm import LLM  # a tree from before the rooms merge (e.g. b80f990)
except ImportError:
    from engine.front.llm import LLM
from engine.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--thread-policy", default="static", choices=["static", "adaptive"])
    parser.add_argument("--model", default=None, help="a GGUF path or name (default: embedded)")
    args = parser.parse_args()
    flat = {} if args.model is None else {"model": args.model}
    try:
        config = EngineConfig.from_flat({**flat, "thread_policy": args.thread_policy})
    except ValueError:  # a tree from before the thread policy
        config = EngineConfig.from_flat(flat)
    llm = LLM(config=config)
    prompts = [
        f"Write a short story about robot number {i} who learns to paint."
        for i in range(args.batch)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    rates = []
    for _ in range(args.reps):
        start = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        rates.append(sum(len(o.output_token_ids) for o in outputs) / (time.perf_counter() - start))
    print(json.dumps({"batch": args.batch, "tok_s_median": statistics.median(rates), "all": rates}))


if __name__ == "__main__":
    main()
