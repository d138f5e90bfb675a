"""N-gram drafts by matched order: how many of a chain's tokens greedy decoding would accept,
by the order n of the n-gram match that produced it (teacher forced, no speculation run).

The model decodes each prompt greedily once; then at every output position the n-gram
proposer (NgramIndex, as NgramProposer uses it) proposes a k-token chain from the text so far,
and the chain's accepted length is its common prefix with the actual continuation, which is what
greedy verification accepts. Reports, per order: proposals, mean accepted tokens, the share with
at least one accepted, and the per-token acceptance a fitted as for chains (accepted over
accepted + rejections). The goodput policy estimates acceptance per order for this reason.

    .venv/bin/python benchmarks/ngram_orders.py --data ../shared/data --num-prompts 8
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.speculation.proposers.ngram import NgramIndex  # noqa: E402


def order_stats(token_ids: list[int], num_prompt: int, k: int, ngram_max: int) -> dict:
    """order -> [proposals, accepted tokens, proposals with one or more accepted, trials]."""
    stats: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
    index = NgramIndex(1, ngram_max)
    for t in range(num_prompt, len(token_ids) - 1):
        index.sync(token_ids[:t])
        end, order = index.best_match(k)
        if not order:
            continue
        chain = token_ids[end : end + k]
        accepted = 0
        for draft, actual in zip(chain, token_ids[t:]):
            if draft != actual:
                break
            accepted += 1
        row = stats[order]
        row[0] += 1
        row[1] += accepted
        row[2] += accepted > 0
        row[3] += accepted + (accepted < len(chain))
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2 GGUF")
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--workloads", default="chat,copy")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    flags = dict(threads=1, max_model_len=2048)
    if args.model:
        flags["model"] = args.model
    llm = LLM(config=EngineConfig.from_flat(flags))
    tokenizer = llm.engine.tokenizer
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0)
    report = {"args": {k: str(v) for k, v in vars(args).items()}}
    for workload in args.workloads.split(","):
        lines = (args.data / f"workload_{workload}.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines[: args.num_prompts]]
        prompts = [
            tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}]) for r in rows
        ]
        totals: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0, 0, 0])
        for prompt, output in zip(prompts, llm.generate(prompts, params, use_tqdm=False)):
            tokens = list(prompt) + list(output.output_token_ids)
            for order, row in order_stats(tokens, len(prompt), args.k, args.ngram_max).items():
                totals[order] = [a + b for a, b in zip(totals[order], row)]
        report[workload] = {
            f"n{order}": dict(
                proposals=n,
                accepted_per_proposal=round(accepted / n, 3),
                any_accepted=round(hits / n, 3),
                per_token_acceptance=round(accepted / trials, 3) if trials else 0.0,
            )
            for order, (n, accepted, hits, trials) in sorted(totals.items())
        }
        print(workload, json.dumps(report[workload]), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
