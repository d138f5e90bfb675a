"""Goodput vs no speculation under Poisson load, in one process: one engine serves the same
arrivals (one seed per round) under each policy, its speculation driver swapped between them,
the policies taking turns round by round, so a machine that drifts between rounds hits them
alike; prints each round's mean latency (arrival to last token) and its ratio to `off`, and the
drafts each speculating policy verified.

One engine, as spec_step_costs.py --one-engine: with an engine per policy, trees of identical
behaviour moved the ratio by ~0.02 from run set to run set, and each policy's own weights and KV
cache were one suspect. One engine did not narrow the rounds' spread (s.d. ~0.04 on the 2-core
VM: docs/benchmarks.md §5zf), so take five or more runs. The server sweep (spec_sweep.py)
restarts a server per cell and its cells vary by +-10% on this 2-core VM.

The start-up heap is frozen, as the server's is (engine/front/heap.py): unfrozen, the collector's
full passes walked it for ~0.1 s each, two or so per 16 rounds under goodput, whose n-gram
indexes allocate, and about none under off, whose steps barely do (docs/benchmarks.md §5zi).
Each policy's collector passes are printed beside its latency.

    .venv/bin/python benchmarks/goodput_load.py --rate 9.5 --rounds 6 --threads 1
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.spec_step_costs import drivers_on  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.heap import CollectorPauses, collection_paused_then_frozen  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.speculation.driver import SpecDriver  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "workload_chat.jsonl"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--policies", nargs="+", default=["off", "goodput"], help="also goodput+probes"
    )
    parser.add_argument("--proposer", default="ngram")
    parser.add_argument("--dataset", default=str(DATA))
    parser.add_argument("--num-prompts", type=int, default=48)
    parser.add_argument("--rate", type=float, default=9.5, help="arrivals per second")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="default: the embedded SmolLM2")
    return parser.parse_args()


def engine_config(policy: str, args: argparse.Namespace) -> EngineConfig:
    """`policy`: a --spec-policy value; `goodput+probes`: goodput without shadow checks."""
    policy, _, variant = policy.partition("+")
    proposer = "none" if policy == "off" else args.proposer  # off with a list would not build
    flat = dict(speculative_proposer=proposer, spec_policy=policy, threads=args.threads)
    flat.update(spec_shadow_checks=variant != "probes")
    flat.update(num_speculative_tokens=5, enable_prefix_caching=False)
    if args.model:
        flat.update(model=args.model)
    return EngineConfig.from_flat(flat)


def build(policies: Sequence[str], args: argparse.Namespace) -> tuple[LLM, dict[str, SpecDriver]]:
    """One LLM, built for the first speculating policy, and a speculation driver per policy on
    its runner (`off`'s without a proposer, as an engine built with --spec-policy off has)."""
    first = next((p for p in policies if not p.startswith("off")), policies[0])
    with collection_paused_then_frozen():  # as the server's start-up heap is
        llm = LLM(config=engine_config(first, args))
        specs = {policy: engine_config(policy, args).spec for policy in policies}
        return llm, drivers_on(llm.engine, first, specs)


def serve(llm: LLM, prompts: list[list[int]], params: SamplingParams, rate: float, seed: int):
    """Mean seconds from arrival to finish, requests arriving as a Poisson process."""
    rng, at, arrivals = random.Random(seed), 0.0, []
    for _ in prompts:
        at += rng.expovariate(rate)
        arrivals.append(at)
    engine, latencies, added = llm.engine, {}, 0
    start = time.perf_counter()
    while len(latencies) < len(prompts):
        now = time.perf_counter() - start
        while added < len(prompts) and arrivals[added] <= now:
            engine.add_request(f"s{seed}-{added}", prompts[added], params)
            added += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, arrivals[added] - now))
            continue
        for output in engine.step():
            if output.finished:
                index = int(output.request_id.rsplit("-", 1)[1])
                latencies[index] = time.perf_counter() - start - arrivals[index]
    return statistics.mean(latencies.values())


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    llm, drivers = build(args.policies, args)
    lines = Path(args.dataset).read_text().splitlines()[: args.num_prompts]
    prompts = [
        llm.tokenizer.apply_chat_template([{"role": "user", "content": json.loads(line)["prompt"]}])
        for line in lines
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    for driver in drivers.values():  # warm-up: allocator, thread pool, caches, first fits
        llm.engine.spec = driver
        llm.generate(prompts[:4], params, use_tqdm=False)
    latency: dict[str, list[float]] = {policy: [] for policy in drivers}
    for round_index in range(args.rounds):
        order = list(drivers) if round_index % 2 == 0 else list(reversed(drivers))
        for policy in order:
            llm.engine.spec = drivers[policy]
            totals = drivers[policy].tally.totals
            before = (totals.num_draft_tokens, totals.num_accepted_tokens)
            with CollectorPauses() as pauses:
                latency[policy].append(serve(llm, prompts, params, args.rate, round_index))
            drafts = totals.num_draft_tokens - before[0]
            accepted = totals.num_accepted_tokens - before[1]
            print(
                f"round {round_index} {policy}: mean latency {latency[policy][-1]:.2f} s, "
                f"{drafts} drafts verified, {accepted} accepted, {pauses.count} collector "
                f"passes ({pauses.full_count} full) {1e3 * pauses.seconds:.1f} ms",
                flush=True,
            )
    if "off" not in latency:
        return
    for policy, values in latency.items():
        ratios = [value / off for value, off in zip(values, latency["off"])]
        print(
            f"{policy}: latency / off per round {[round(r, 3) for r in ratios]}, "
            f"median {statistics.median(ratios):.3f}, mean {statistics.mean(ratios):.3f}"
        )


if __name__ == "__main__":
    main()
