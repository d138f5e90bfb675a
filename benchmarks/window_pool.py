"""What the sliding-window layers' own block pool buys (engine/core/kv_budget.py): two engines
on the same model and KV budget in one process, one with the window pool (the default) and one
with --no-sliding-window-pool, side by side:

- the pools each gets and the positions its full-attention layers can hold;
- greedy tokens of a prompt longer than the window, from both (the same, or the first
  difference);
- a prompt longer than the unsplit cache holds: served by one, refused by the other;
- decode tok/s at batch 1 on a long prompt, the engines taking turns round by round, who goes
  first alternating (a prefill pass, then the timed pass from the prefix cache: decode only).
  Which engine is built first moved the ratio by ~15% (docs/benchmarks.md §5j): run it both
  ways (--build-first).

    .venv/bin/python benchmarks/window_pool.py --model ~/.cache/goodspeed/models/gemma3/\
gemma-3-270m-q4_k_m.gguf --kv-cache-memory 256MiB --max-num-seqs 4
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
GEMMA = Path.home() / ".cache/goodspeed/models/gemma3/gemma-3-270m-q4_k_m.gguf"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(GEMMA))
    parser.add_argument("--kv-cache-memory", default="256MiB")
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=1500)
    parser.add_argument("--long-prompt-tokens", type=int, default=0, help="0: 1.5x unsplit")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--build-first",
        choices=["pool", "unsplit"],
        default="pool",
        help="which engine is built first (the first-built one ran slower in our A/Bs)",
    )
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    return parser.parse_args()


def make(args, pool: bool) -> LLM:
    flat = dict(
        model=args.model,
        kv_cache_memory=args.kv_cache_memory,
        max_num_seqs=args.max_num_seqs,
        threads=args.threads,
        sliding_window_pool=pool,
    )
    return LLM(config=EngineConfig.from_flat(flat))


def text_ids(llm: LLM, tokens: int, shift: int) -> list[int]:
    """`tokens` tokens of the copy workload's pages, from page `shift` on."""
    texts = [json.loads(line)["prompt"] for line in WORKLOAD.read_text().splitlines()]
    ids: list[int] = []
    index = shift
    while len(ids) < tokens:
        ids += llm.engine.tokenizer.encode(texts[index % len(texts)])
        index += 1
    return ids[:tokens]


def pools(llm: LLM) -> dict:
    manager = llm.engine.scheduler.block_manager
    window = manager.window_pool
    return {
        "full_blocks": manager.num_total_blocks,
        "full_positions": manager.num_total_blocks * manager.block_size,
        "window_blocks": window.num_total_blocks if window else None,
        "servable_len": llm.engine.max_model_len,
    }


def greedy(llm: LLM, prompt: list[int], new_tokens: int):
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    return out


def decode_rate(llm: LLM, prompt: list[int], new_tokens: int) -> float:
    """Tokens after the first / (finish - first token), the prompt served from the prefix
    cache (a first pass prefilled it)."""
    greedy(llm, prompt, 1)
    out = greedy(llm, prompt, new_tokens)
    seconds = out.metrics["finished_time"] - out.metrics["first_token_time"]
    return (len(out.output_token_ids) - 1) / seconds


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)


def main() -> None:
    args = parse_args()
    order = ["pool", "unsplit"] if args.build_first == "pool" else ["unsplit", "pool"]
    engines = {name: make(args, name == "pool") for name in order}
    result = {"args": vars(args), "load": os.getloadavg(), "pools": {}}
    for name, llm in engines.items():
        result["pools"][name] = pools(llm)
    print(json.dumps(result["pools"], indent=1))
    prompt = text_ids(engines["pool"], args.prompt_tokens, 0)
    tokens = {
        n: greedy(llm, prompt, args.new_tokens).output_token_ids for n, llm in engines.items()
    }
    result["tokens_equal"] = tokens["pool"] == tokens["unsplit"]
    result["first_difference"] = first_difference(tokens["pool"], tokens["unsplit"])
    print("greedy tokens, first difference:", result["first_difference"])
    long_tokens = args.long_prompt_tokens or int(1.5 * result["pools"]["unsplit"]["full_positions"])
    long_prompt = text_ids(engines["pool"], long_tokens, 3)
    result["long_prompt"] = {"tokens": long_tokens}
    for name, llm in engines.items():
        try:
            out = greedy(llm, long_prompt, 8)
            served = out.error or f"served, {len(out.output_token_ids)} tokens"
        except ValueError as exc:  # refused at admission: longer than the servable context
            served = f"refused: {exc}"
        result["long_prompt"][name] = served
    print("long prompt:", result["long_prompt"])
    rates: dict[str, list[float]] = {name: [] for name in engines}
    for round_index in range(args.rounds):
        turns = order if round_index % 2 == 0 else order[::-1]  # who goes first alternates
        for name, llm in ((n, engines[n]) for n in turns):
            prompt = text_ids(llm, args.prompt_tokens, 10 + round_index)
            rates[name].append(decode_rate(llm, prompt, args.new_tokens))
        print(f"round {round_index}: " + ", ".join(f"{n} {r[-1]:.1f}" for n, r in rates.items()))
    result["decode_tok_s"] = rates
    result["ratio_per_round"] = [p / u for p, u in zip(rates["pool"], rates["unsplit"])]
    result["median_ratio"] = statistics.median(result["ratio_per_round"])
    result["load_after"] = os.getloadavg()
    print("pool / unsplit per round:", [f"{r:.3f}" for r in result["ratio_per_round"]])
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
