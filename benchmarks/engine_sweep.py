"""Speculation policy sweep in process: mean request latency vs load, per policy, no HTTP.

The same question as benchmarks/spec_sweep.py (SmartSpec, arXiv 2406.14066: fixed speculation
helps at light load and hurts under load; goodput must never be slower than none), asked of the
engine directly, for machines without the server's packages (the GPU machine). Each policy's
engine (--proposer, n-gram unless told, up to --k drafts, prefix caching off) is built once. The
load unit is 1 / (mean latency of one request alone, policy off), measured first per workload
(or given: --unit, one for all or per workload, so that runs in several processes offer the same
load); each cell sends --num-prompts requests of a workload (chat-templated, greedy, EOS
ignored) with Poisson arrivals at multiplier x that rate, and the policies take turns cell by
cell, --repeats times over the same arrivals, in an order balanced over the sweep
(benchmarks/turns.py: none always runs right after the same other). Near saturation one cell's
latency moves by tens of percent from run to run; the table gives each policy's mean over the
repeats and the range of the repeats' ratios, and a twin of off (--policies off,goodput,off#2)
reads the noise. Latency = finish - arrival (each cell also keeps the mean time to first token);
the engine steps whenever something is in flight. The engines' start-up heap is frozen as the
server's is (engine/front/heap.py; --no-freeze leaves it to the collector), and each cell counts
the collector's passes.

    python benchmarks/engine_sweep.py --model M.gguf --device cuda --dtype bfloat16 \\
        --policies off,goodput,fixed:3 --multipliers 1,4,16 --out /tmp/sweep.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import sys
import time
from datetime import date
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.turns import turn_order  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.heap import CollectorPauses, collection_paused_then_frozen  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402

WORKLOADS = {"copy": "workload_copy.jsonl", "chat": "workload_chat.jsonl"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument(
        "--policies", default="off,goodput,fixed:3", help='"off#2": a twin of off, its noise'
    )
    parser.add_argument("--workloads", default="copy,chat")
    parser.add_argument("--multipliers", default="1,4,16")
    parser.add_argument("--num-prompts", type=int, default=16, help="requests per cell")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4, help="most drafts per step")
    parser.add_argument(
        "--proposer", default="ngram", help="ngram, recycle, draft, a comma list, or auto"
    )
    parser.add_argument(
        "--draft-model", default=None, help="the draft model's GGUF (with draft or auto)"
    )
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="turns of the policies a cell")
    parser.add_argument(
        "--unit",
        type=parse_units,
        default={},
        help="requests/s at x1: one number for every workload, or per workload "
        "(chat=3.3,copy=0.9); a workload not named is measured",
    )
    parser.add_argument(
        "--no-freeze",
        action="store_true",
        help="leave the start-up heap to the collector's full passes (the server freezes it)",
    )
    parser.add_argument("--out", type=Path, required=True, help="JSON; a .md is written beside")
    return parser.parse_args(argv)


def make_engine(policy: str, args: argparse.Namespace) -> LLM:
    """The engine of a policy; "off#2" (any "#" suffix) is a twin, built again under its own
    name, whose ratio to the first reads the cell's noise."""
    policy = policy.partition("#")[0]
    flat = dict(model=args.model, device=args.device, dtype=args.dtype)
    flat.update(enable_prefix_caching=False, max_num_seqs=args.max_num_seqs)
    if policy != "off":
        flat.update(speculative_proposer=args.proposer, spec_policy=policy)
        flat.update(num_speculative_tokens=args.k, draft_model=args.draft_model)
    return LLM(config=EngineConfig.from_flat(flat))


def load_prompts(llm: LLM, workload: str, args: argparse.Namespace) -> list[list[int]]:
    path = Path(args.data) / WORKLOADS[workload]
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    texts = [json.loads(line)["prompt"] for line in lines]
    chat = llm.tokenizer.apply_chat_template
    return [chat([{"role": "user", "content": texts[i % len(texts)]}]) for i in range(len(texts))]


def run_cell(llm: LLM, prompts: list[list[int]], gaps: list[float], max_tokens: int) -> dict:
    """Send prompts[i] gaps[:i+1] seconds after the start; step until all finish. The
    collector's passes meanwhile are counted (a full pass can cost dozens of GPU steps)."""
    engine = llm.engine
    before = engine.stats()
    start = time.monotonic()
    arrivals = [start + sum(gaps[: i + 1]) for i in range(len(prompts))]
    with CollectorPauses() as pauses:
        first, done = _serve(engine, prompts, arrivals, max_tokens)
    after = engine.stats()
    latencies = [done[f"r{i}"] - arrivals[i] for i in range(len(prompts))]
    waits = [first[f"r{i}"] - arrivals[i] for i in range(len(prompts))]
    return dict(
        mean_latency=sum(latencies) / len(latencies),
        mean_ttft=sum(waits) / len(waits),
        wall=max(done.values()) - start,
        steps=after.num_steps_total - before.num_steps_total,
        draft_tokens=after.spec_num_draft_tokens_total - before.spec_num_draft_tokens_total,
        accepted=after.spec_num_accepted_tokens_total - before.spec_num_accepted_tokens_total,
        **pauses.as_dict(),
    )


def _serve(
    engine, prompts: list[list[int]], arrivals: list[float], max_tokens: int
) -> tuple[dict, dict]:
    """Each request's first-token and finish times, by request id (r0, r1, ...)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    sent = 0
    while len(done) < len(prompts):
        now = time.monotonic()
        while sent < len(prompts) and arrivals[sent] <= now:
            engine.add_request(f"r{sent}", prompts[sent], params, arrival_time=arrivals[sent])
            sent += 1
        if not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(arrivals[sent] - now, 0.01)))
            continue
        for output in engine.step():
            if output.new_token_ids and output.request_id not in first:
                first[output.request_id] = time.monotonic()
            if output.finished:
                done[output.request_id] = time.monotonic()
    return first, done


def sweep(args: argparse.Namespace) -> dict:
    policies = args.policies.split(",")
    with contextlib.nullcontext() if args.no_freeze else collection_paused_then_frozen():
        engines = {policy: make_engine(policy, args) for policy in policies}
    rng = random.Random(args.seed)
    cells = []
    turn = 0  # the turns' order is balanced over the whole sweep (benchmarks/turns.py)
    for workload in args.workloads.split(","):
        prompts = load_prompts(engines[policies[0]], workload, args)
        unit = args.unit.get(workload, args.unit.get("")) or load_unit(
            engines["off"], prompts, args.max_tokens
        )
        for multiplier in (float(m) for m in args.multipliers.split(",")):
            count = args.num_prompts
            gaps = [rng.expovariate(multiplier * unit) for _ in range(count)]
            chosen = [prompts[rng.randrange(len(prompts))] for _ in range(count)]
            for repeat in range(args.repeats):
                for policy in turn_order(policies, turn):
                    result = run_cell(engines[policy], chosen, gaps, args.max_tokens)
                    result.update(workload=workload, multiplier=multiplier, policy=policy)
                    result.update(repeat=repeat, unit=unit)
                    cells.append(result)
                    print(json.dumps(result), flush=True)
                turn += 1
    return dict(cells=cells, meta=meta(args))


def parse_units(text: str) -> dict[str, float]:
    """--unit: "3.3" (every workload: key "") or "chat=3.3,copy=0.9" (a copy prompt's
    prefill makes one request alone several times a chat request's, so chat's unit puts the
    copy cells past saturation: docs/benchmarks.md §5zo)."""
    units = {}
    for part in text.split(","):
        workload, _, value = part.rpartition("=")
        unit = units[workload.strip()] = float(value)
        if unit <= 0:
            raise argparse.ArgumentTypeError(f"a unit must be > 0: {part!r}")
    return units


def load_unit(off: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    """Requests per second at x1: 1 / the mean latency of two requests alone, policy off."""
    alone = [run_cell(off, [p], [0.0], max_tokens) for p in prompts[:2]]
    latency = sum(cell["mean_latency"] for cell in alone) / len(alone)
    return 1.0 / max(latency, 1e-3)


def meta(args: argparse.Namespace) -> dict:
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    return dict(date=date.today().isoformat(), device=device, args=vars(args) | {"out": ""})


def markdown(result: dict) -> str:
    """Per cell, each policy's mean latency over the repeats and its ratio to off's, with the
    range of the repeats' own ratios where there are several; with goodput and a twin of off,
    goodput's mean over the mean of off's and its twins'; with goodput and a fixed:k, goodput's
    mean over the best of off and the fixed policies' (#28: <= 1.03x everywhere)."""
    rows: dict = {}
    for cell in result["cells"]:
        latencies = rows.setdefault((cell["workload"], cell["multiplier"]), {})
        latencies.setdefault(cell["policy"], []).append(cell["mean_latency"])
    policies = list(dict.fromkeys(c["policy"] for c in result["cells"]))
    others = [p for p in policies if p != "off"]
    fixed = ["off"] + [p for p in policies if p.startswith("fixed:")]
    offs = ["off"] + [p for p in policies if p.startswith("off#")]
    best = "goodput" in policies and len(fixed) > 1
    pooled = "goodput" in policies and len(offs) > 1
    head = "| workload | load | " + " | ".join(f"{p} s" for p in policies)
    head += " | " + " | ".join(f"{p}/off" for p in others)
    head += " | goodput/offs" * pooled + " | goodput/best fixed" * best + " |"
    lines = [head, "|" + "---|" * (2 * len(policies) + 1 + pooled + best)]
    for (workload, multiplier), latencies in rows.items():
        means = {p: statistics.fmean(latencies[p]) for p in policies}
        ratios = [_ratio(latencies[p], latencies["off"]) for p in others]
        if pooled:  # over the mean of off and its twins: a steadier baseline than off alone
            ratios.append(f"{means['goodput'] / statistics.fmean(means[p] for p in offs):.3f}")
        if best:  # off counts as k = 0; a twin (off#2) does not count
            ratios.append(f"{means['goodput'] / min(means[p] for p in fixed):.2f}")
        lines.append(
            f"| {workload} | x{multiplier:g} | "
            + " | ".join(f"{means[p]:.3f}" for p in policies)
            + " | "
            + " | ".join(ratios)
            + " |"
        )
    return "\n".join(lines) + "\n"


def _ratio(latencies: list[float], off: list[float]) -> str:
    """The ratio of the means; with repeats, the range of the repeat-by-repeat ratios."""
    text = f"{statistics.fmean(latencies) / statistics.fmean(off):.2f}"
    if len(latencies) > 1:
        each = [a / b for a, b in zip(latencies, off)]
        text += f" ({min(each):.2f}-{max(each):.2f})"
    return text


def main() -> None:
    args = parse_args()
    if "off" not in args.policies.split(","):
        sys.exit("--policies must include off (the load unit and every ratio's baseline)")
    result = sweep(args)
    args.out.write_text(json.dumps(result, indent=1))
    text = markdown(result)
    args.out.with_suffix(".md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
