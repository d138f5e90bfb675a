"""What a 16-bit KV cache buys: decode tok/s with --kv-cache-dtype float32 vs float16 vs
bfloat16, in one process, the engines taking turns round by round (so a busy machine slows
every variant alike), at a batch of long-prompt requests where the cache's bytes count.

Each round first prefills the batch's prompts (one token each: the prefill time is reported
as TTFT), then runs them again for --new-tokens: the prompts now come from the prefix cache,
so the timed pass is decode only (no request decodes beside another's prefill). Decode rate =
the batch's tokens after the first / (last finish - first first token). Prompts: the copy
workload (documentation pages) cut to --prompt-tokens.

    .venv/bin/python benchmarks/kv_dtype.py --batch 1 16 --prompt-tokens 1000 --rounds 3
    .venv/bin/python benchmarks/kv_dtype.py --model ~/.cache/goodspeed/models/qwen-pair/\
qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --batch 1 8 --prompt-tokens 700
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

from engine.config import EngineConfig
from engine.front.llm import LLM
from engine.sampling_params import SamplingParams

WORKLOAD = Path(__file__).resolve().parents[2] / "shared" / "data" / "workload_copy.jsonl"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF or HF dir (default: the embedded)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    return parser.parse_args()


def prompts(llm: LLM, count: int, tokens: int, shift: int = 0) -> list[list[int]]:
    """`count` prompts of `tokens` tokens; another `shift` gives other documents (so a round's
    prefill pass really prefills)."""
    texts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()]
    tokenizer = llm.engine.tokenizer
    out = []
    for i in range(shift * count, shift * count + count):
        ids = tokenizer.encode(texts[i % len(texts)] + texts[(i + 1) % len(texts)])
        out.append(ids[:tokens])
    return out


def decode_rate(llm: LLM, batch: list[list[int]], new_tokens: int) -> tuple[float, float]:
    """(decode tok/s over the batch, mean time to first token in s)."""
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    outputs = llm.generate(batch, params, use_tqdm=False)
    first = min(o.metrics["first_token_time"] for o in outputs)
    last = max(o.metrics["finished_time"] for o in outputs)
    tokens = sum(len(o.output_token_ids) - 1 for o in outputs)
    ttft = statistics.mean(
        o.metrics["first_token_time"] - o.metrics["arrival_time"] for o in outputs
    )
    return tokens / (last - first), ttft


def main() -> None:
    args = parse_args()
    base = {"threads": args.threads, "thread_policy": "static", "spec_policy": "off"}
    if args.model:
        base["model"] = args.model
    base["max_num_seqs"] = max(args.batch)
    llms = {
        dtype: LLM(config=EngineConfig.from_flat({**base, "kv_cache_dtype": dtype}))
        for dtype in args.dtypes
    }
    first = next(iter(llms.values()))
    results: dict[str, dict[str, list[float]]] = {}
    for batch in args.batch:
        for llm in llms.values():  # warm-up: page in, first-call costs
            decode_rate(llm, prompts(first, 1, args.prompt_tokens, 999), 4)
        for round_ in range(args.rounds):
            batch_prompts = prompts(first, batch, args.prompt_tokens, round_)
            order = list(llms) if round_ % 2 == 0 else list(reversed(llms))
            for dtype in order:
                rate, ttft = decode_rate(llms[dtype], batch_prompts, args.new_tokens)
                cell = results.setdefault(f"b{batch}/{dtype}", {"tok_s": [], "ttft_s": []})
                cell["tok_s"].append(rate)
                cell["ttft_s"].append(ttft)
                print(f"b{batch} round {round_} {dtype}: {rate:.1f} tok/s, TTFT {ttft:.2f} s")
    print(
        f"\nload {os.getloadavg()}; prompt {args.prompt_tokens} tokens; medians, ratio to float32"
    )
    for key, cell in results.items():
        batch, dtype = key.split("/")
        rate = statistics.median(cell["tok_s"])
        base_rate = (
            statistics.median(results[f"{batch}/float32"]["tok_s"])
            if (f"{batch}/float32" in results)
            else rate
        )
        print(
            f"{key:>16}: {rate:7.1f} tok/s ({rate / base_rate:.2f}x), "
            f"TTFT {statistics.median(cell['ttft_s']):.2f} s"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
