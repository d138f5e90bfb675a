"""Batch-1 decode speed of speculative decoding on SmolLM2-135M: off vs each proposer and shape.

For every config (off, n-gram, Token Recycling, a self-draft of SmolLM2's first layers; chains
and trees) and both workloads (copy-heavy documentation prompts, open-ended chat prompts, from
../shared/data, through the chat template), each prompt is generated alone, greedy, with a
fixed number of new tokens (EOS ignored). Decode tok/s = tokens after the first one / time
from the first token to the last, so prefill is excluded. All engines are loaded up front and
the configs take turns prompt by prompt, so drift in the machine's load hits them alike; the
speedup is against `off` in the same run. Acceptance = accepted / drafted tokens; 'accepted
per step' = mean accepted drafts per verification step (the accepted path length for trees);
'tokens per step' = decode tokens / decode steps. Each run's tokens are also compared with
off's (greedy speculation must be lossless).

    .venv/bin/python benchmarks/spec_bench.py --threads 1                  # full (long)
    .venv/bin/python benchmarks/spec_bench.py --num-prompts 1 --max-tokens 32 \\
        --configs off,ngram-chain --markdown /tmp/smoke.md --out /tmp/smoke.json  # smoke
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from datetime import datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.report import load_average, machine_description, write_section  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402
from engine.outputs import RequestOutput  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.speculation.control.rest import PlanningRest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
WORKLOADS = {"copy": "workload_copy.jsonl", "chat": "workload_chat.jsonl"}
PROPOSERS = ("off", "ngram", "recycle", "draft")
ALL_CONFIGS = ("off",) + tuple(f"{p}-{s}" for p in PROPOSERS[1:] for s in ("chain", "tree"))
SECTION = "spec-batch1"
COUNTED = ("decode_tokens", "decode_seconds", "decode_steps", "draft_tokens", "accepted_tokens")
COUNTED += ("verify_steps", "rested_steps", "plans", "drafting_plans")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--configs", default=",".join(ALL_CONFIGS), help="comma-separated")
    parser.add_argument("--workloads", default="copy,chat", help="comma-separated: copy, chat")
    parser.add_argument("--k", type=int, default=4, help="chain length (drafts per step)")
    parser.add_argument("--tree-nodes", type=int, default=8, help="tree node budget")
    parser.add_argument("--policy", default="fixed", help="'fixed' (k / node budget) or 'goodput'")
    parser.add_argument(
        "--no-rest",
        action="store_true",
        help="goodput plans every step (PlanningRest never skips; its ledgers are kept)",
    )
    parser.add_argument("--draft-model", default="self:8", help="draft for draft-*: self:N or path")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--device", default="cpu", help="cpu | cuda")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--data", default=str(DATA), help="folder of the workload files")
    parser.add_argument("--out", default=str(ROOT / "docs" / "bench_spec_batch1.json"))
    parser.add_argument("--markdown", default=str(ROOT / "docs" / "bench_spec_batch1.md"))
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [c for c in args.configs if c not in ALL_CONFIGS]
    unknown += [w for w in args.workloads if w not in WORKLOADS]
    if unknown or args.policy not in ("fixed", "goodput"):
        parser.error(
            f"unknown {unknown or args.policy}; configs: {ALL_CONFIGS}; workloads: copy, chat"
        )
    # off first: the baseline of every speedup and the tokens every run is compared with
    args.configs = ["off"] + [c for c in dict.fromkeys(args.configs) if c != "off"]
    return args


def config_flat(name: str, args: argparse.Namespace) -> dict:
    """Flat EngineConfig fields for a config name such as 'ngram-tree'."""
    # 128 blocks of 16 tokens hold one prompt (< 600 tokens) + max_tokens + drafts.
    flat = dict(model=args.model, dtype=args.dtype, threads=args.threads, num_kv_blocks=128)
    flat.update(device=args.device)
    if name == "off":
        return flat
    proposer, shape = name.split("-")
    budget = args.k if shape == "chain" else args.tree_nodes
    policy = f"fixed:{budget}" if args.policy == "fixed" else "goodput"
    flat.update(speculative_proposer=proposer, spec_policy=policy, num_speculative_tokens=args.k)
    flat.update(spec_tree_nodes=0 if shape == "chain" else args.tree_nodes)
    if proposer == "draft":
        flat.update(draft_model=args.draft_model)
    return flat


def load_prompts(llm: LLM, workload: str, count: int, data_dir: str) -> list[list[int]]:
    path = Path(data_dir) / WORKLOADS[workload]
    if not path.exists():
        sys.exit(f"{path} is missing: the shared workloads live in ../shared/data beside the repo")
    lines = [line for line in path.read_text().splitlines() if line.strip()][:count]
    texts = [json.loads(line)["prompt"] for line in lines]
    return [llm.tokenizer.apply_chat_template([{"role": "user", "content": t}]) for t in texts]


SAMPLING_SEED = 1234  # sampled runs: one seed, so speculation must not change the tokens


def run_one(llm: LLM, prompt: list[int], max_tokens: int, temperature: float = 0.0) -> dict:
    """Generate one prompt alone; time from its first token to its last, and count spec steps.
    Sampled (temperature > 0) with a fixed seed, so every config must give the same tokens."""
    marks: list[tuple[float, int]] = []  # (time, tokens so far) after each step with output

    def on_output(output: RequestOutput) -> None:
        marks.append((time.perf_counter(), len(output.output_token_ids)))

    before = llm.engine.stats()
    driver = llm.engine.spec  # its rest's and plans' counts (engine/speculation/driver.py)
    counts = (driver.num_rested, driver.num_plans, driver.num_drafting_plans)
    seed = SAMPLING_SEED if temperature > 0 else None
    params = SamplingParams(
        temperature=temperature, seed=seed, max_tokens=max_tokens, ignore_eos=True
    )
    [output] = llm.generate(prompt, params, use_tqdm=False, on_output=on_output)
    after = llm.engine.stats()
    (first_time, first_tokens), (last_time, last_tokens) = marks[0], marks[-1]
    return dict(
        token_ids=output.output_token_ids,
        decode_tokens=last_tokens - first_tokens,
        decode_seconds=last_time - first_time,
        decode_steps=len(marks) - 1,
        draft_tokens=after.spec_num_draft_tokens_total - before.spec_num_draft_tokens_total,
        accepted_tokens=after.spec_num_accepted_tokens_total
        - before.spec_num_accepted_tokens_total,
        verify_steps=after.spec_num_drafts_total - before.spec_num_drafts_total,
        rested_steps=driver.num_rested - counts[0],
        plans=driver.num_plans - counts[1],
        drafting_plans=driver.num_drafting_plans - counts[2],
        long_ledger=driver.rest.long_ledger() if driver.rest is not None else None,
    )


def bench(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    engines = {
        name: LLM(config=EngineConfig.from_flat(config_flat(name, args))) for name in args.configs
    }
    if args.no_rest:  # the driver then plans every step; the rests keep their ledgers
        PlanningRest.skips = lambda self: False
    runs = []
    for workload in args.workloads:
        prompts = load_prompts(engines["off"], workload, args.num_prompts, args.data)
        for llm in engines.values():  # warm-up: first-step costs, lazy allocations
            run_one(llm, prompts[0][:64], 8)
        for index, prompt in enumerate(prompts):
            reference = None
            for name, llm in engines.items():  # configs take turns: load drift hits all alike
                run = run_one(llm, prompt, args.max_tokens)
                reference = reference if name != "off" else run["token_ids"]
                run.update(workload=workload, config=name, prompt=index, prompt_tokens=len(prompt))
                run["identical_to_off"] = run.pop("token_ids") == reference
                runs.append(run)
                print(f"{workload} #{index} {name}: {rate(run):.1f} tok/s", flush=True)
    return dict(
        date=datetime.now().isoformat(timespec="seconds"),
        command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
        machine=machine_description(),
        load_average=load_average(),
        torch=torch.__version__,
        args={k: v for k, v in vars(args).items() if k not in ("out", "markdown")},
        runs=runs,
        rows=summarize(runs, args),
    )


def rate(run: dict) -> float:
    return run["decode_tokens"] / run["decode_seconds"] if run["decode_seconds"] > 0 else 0.0


def summarize(runs: list[dict], args: argparse.Namespace) -> list[dict]:
    """One row per (workload, config): totals over its prompts, speedup vs off's total rate."""
    rows = []
    for workload in args.workloads:
        mine = [r for r in runs if r["workload"] == workload]
        base = None
        for name in args.configs:
            group = [r for r in mine if r["config"] == name]
            total = {k: sum(r[k] for r in group) for k in COUNTED}
            tok_s = total["decode_tokens"] / total["decode_seconds"]
            base = tok_s if name == "off" else base
            drafted, verified = total["draft_tokens"], total["verify_steps"]
            rows.append(
                dict(
                    workload=workload,
                    config=name,
                    tok_s=tok_s,
                    speedup=tok_s / base,
                    acceptance=total["accepted_tokens"] / drafted if drafted else None,
                    accepted_per_step=total["accepted_tokens"] / verified if verified else None,
                    tokens_per_step=total["decode_tokens"] / max(1, total["decode_steps"]),
                    identical=all(r["identical_to_off"] for r in group),
                    plans=(total["drafting_plans"], total["plans"], total["rested_steps"]),
                    long_ledger=group[-1].get("long_ledger"),  # after the group's last run
                )
            )
    return rows


def markdown(results: dict) -> str:
    args = results["args"]
    quick = args["num_prompts"] < 3 or args["max_tokens"] < 128
    lines = [
        "## Speculative decoding (batch 1)" + (" — quick smoke run, not a result" if quick else ""),
        "",
        f"`{results['command']}` — {results['date']}, {results['machine']}, "
        f"{results['load_average']} at the end, torch {results['torch']}, "
        f"{args['threads']} thread(s). {Path(args['model']).name} {args['dtype']} on "
        f"{args['device']}, greedy, "
        f"{args['max_tokens']} new tokens, {args['num_prompts']} prompt(s) per workload, each "
        f"alone; chains k = {args['k']}, trees {args['tree_nodes']} nodes, policy {args['policy']}, "
        f"draft {args['draft_model']}{', no rest' if args.get('no_rest') else ''}. "
        "Decode tok/s excludes prefill; speedup vs off in the same "
        "run; acceptance = accepted / drafted tokens; accepted/step = mean accepted drafts per "
        "verification step; tokens/step = decode tokens per decode step; plans = plans that "
        "drafted / plans / steps the goodput rest skipped (engine/speculation/control/rest.py); "
        "identical = greedy tokens equal off's.",
        "",
        "| workload | config | decode tok/s | speedup | acceptance | accepted/step | tokens/step "
        "| plans | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        acceptance = "-" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
        per_step = "-" if row["accepted_per_step"] is None else f"{row['accepted_per_step']:.2f}"
        lines.append(
            f"| {row['workload']} | {row['config']} | {row['tok_s']:.1f} | {row['speedup']:.2f}x "
            f"| {acceptance} | {per_step} | {row['tokens_per_step']:.2f} "
            f"| {'/'.join(map(str, row.get('plans', ())))} "
            f"| {'yes' if row['identical'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = bench(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    write_section(Path(args.markdown), SECTION, text, "# Speculative decoding benchmarks")
    print(text)
    return 0 if all(row["identical"] for row in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
