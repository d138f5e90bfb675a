"""Batch-1 speed of draft-model speculation on the Qwen2.5-Coder pair (0.5B drafts for 1.5B).

Both models run their GGUF blocks on the native CPU kernels (`--weights gguf`). Workloads:
copy-heavy documentation and open-ended chat (../shared/data) and code editing
(benchmarks/data/workload_code_edit.jsonl: a 20-60 line snippet and a small change, so the
answer mostly copies the code), and `mixed` (code editing and chat prompts taking turns, the
same engines carrying their estimates from one to the next), all through the chat template.
Each prompt is generated alone, greedy (or sampled at --temperature with one seed), with a
fixed number of new tokens (EOS ignored); tok/s, acceptance and tokens per step are measured as
in spec_bench.py (decode only, prefill excluded) and each config's tokens are compared with
off's. Configs are `off` or `PROPOSER[:chain|tree[:BUDGET]][@goodput]`:
`draft:chain:4` (k = 4, fixed), `draft:tree` (8 nodes), `ngram`, `recycle:tree:16`,
`draft:chain:4@goodput` (the goodput policy choosing k <= 4), `auto:chain:4` (n-gram, recycle
and the draft model, the goodput policy choosing a proposer and k per request and step); a
`+vN` suffix gives the draft a head over the first N token ids (`--draft-vocab N`), e.g.
`draft:chain:4+v32768`; a `+probes` suffix turns off the shadow checks (the goodput policy's
estimates of proposers not drafting then move only by forced probes), e.g. `auto:chain:4+probes`.

With an `auto` config, each workload's table is followed by auto's rate over each single
proposer's, with a 90% interval from resampling whole prompts (both configs' runs of a prompt
drawn together), so "within 3% of the best single proposer" can be read against the noise.
`--pool A.json B.json ...` runs nothing: it pools the runs that repeats of one command wrote
with `--out`, per prompt, and prints the comparisons of the pooled runs.

--interleave loads every engine up front and lets the configs take turns prompt by prompt (load
drift hits them alike; needs the memory of all engines at once), in an order balanced over
turns (`turn_order`), so no config always runs right after the same other one (whose weights it
would find in, or evicted from, the cache); without it one engine lives at a time and runs all
prompts.

    .venv/bin/python benchmarks/draft_pair.py --num-prompts 2 --max-tokens 32   # smoke
    .venv/bin/python benchmarks/draft_pair.py --interleave --configs off draft:chain:4 draft:tree
    .venv/bin/python benchmarks/draft_pair.py --pool run1.json run2.json run3.json
"""

from __future__ import annotations

import argparse
import gc
import json
import shlex
import sys
from datetime import datetime
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models.qwen_pair import FETCH_HINT, pair_paths  # noqa: E402
from benchmarks.report import bootstrap_interval, load_average, machine_description  # noqa: E402
from benchmarks.spec_bench import rate, run_one, summarize  # noqa: E402
from benchmarks.turns import turn_order  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.front.llm import LLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = {
    "copy": ROOT.parent / "shared" / "data" / "workload_copy.jsonl",
    "chat": ROOT.parent / "shared" / "data" / "workload_chat.jsonl",
    "code_edit": ROOT / "benchmarks" / "data" / "workload_code_edit.jsonl",
}
# Code editing and open-ended chat taking turns, --num-prompts of each: where choosing the
# proposer per request can beat every single one (n-gram copies code, the draft model chats).
MIXED = ("code_edit", "chat")
PROPOSERS = ("draft", "ngram", "recycle", "auto")
DEFAULT_BUDGET = {"chain": 4, "tree": 8}  # chain: k; tree: node budget


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=4, help="prompts per workload")
    parser.add_argument("--max-tokens", type=int, default=128, help="new tokens per prompt")
    parser.add_argument("--configs", nargs="+", default=["off", "draft:chain:4", "draft:tree"])
    parser.add_argument(
        "--workloads", nargs="+", default=list(WORKLOADS), choices=[*WORKLOADS, "mixed"]
    )
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled with one seed"
    )
    parser.add_argument("--interleave", action="store_true", help="configs take turns per prompt")
    parser.add_argument("--target", help="target GGUF (default: the qwen_pair.sh 1.5B)")
    parser.add_argument("--draft", help="draft GGUF (default: the qwen_pair.sh 0.5B)")
    parser.add_argument("--out", help="also write the runs and rows as JSON here")
    parser.add_argument(
        "--pool",
        nargs="+",
        metavar="JSON",
        help="run nothing: pool the runs of these --out files (one command run repeatedly) "
        "per prompt and print the comparisons",
    )
    args = parser.parse_args(argv)
    if args.pool:
        return args
    if args.target is None or args.draft is None:
        paths = pair_paths()
        if paths is None:
            parser.error(f"the Qwen pair is missing: {FETCH_HINT} (or give --target/--draft)")
        args.target = args.target or str(paths[0])
        args.draft = args.draft or str(paths[1])
    try:
        args.flat = {name: config_flat(name, args) for name in dict.fromkeys(args.configs)}
    except ValueError as error:
        parser.error(str(error))
    # off first: the baseline of every speedup and the tokens every run is compared with
    args.configs = ["off"] + [c for c in args.flat if c != "off"]
    args.flat.setdefault("off", config_flat("off", args))
    return args


def config_flat(name: str, args: argparse.Namespace) -> dict:
    """Flat EngineConfig fields for `off` or
    `PROPOSER[:chain|tree[:BUDGET]][@goodput][+vN][+probes]` (+probes: no shadow checks)."""
    # 128 blocks of 16 tokens hold one prompt (< 1000 tokens) + max_tokens + drafts.
    flat = dict(model=args.target, weights="gguf", dtype="float32", threads=args.threads)
    flat.update(num_kv_blocks=128)
    if name == "off":
        return flat
    name, *extras = name.split("+")
    vocab = next((e[1:] for e in extras if e.startswith("v")), "")
    flat.update(spec_shadow_checks="probes" not in extras)
    spec, _, policy = name.partition("@")
    proposer, shape, budget = [*spec.split(":"), None, None][:3]
    if proposer not in PROPOSERS or shape not in (None, "chain", "tree"):
        raise ValueError(f"config {name!r}: use off or PROPOSER[:chain|tree[:BUDGET]], {PROPOSERS}")
    shape = shape or "chain"
    budget = int(budget) if budget else DEFAULT_BUDGET[shape]
    goodput = policy == "goodput" or proposer == "auto"  # choosing a proposer needs goodput
    flat.update(speculative_proposer=proposer)
    flat.update(spec_policy="goodput" if goodput else f"fixed:{budget}")
    flat.update(num_speculative_tokens=budget if shape == "chain" else 4)
    flat.update(spec_tree_nodes=0 if shape == "chain" else budget)
    if proposer in ("draft", "auto"):
        flat.update(draft_model=args.draft, draft_vocab=int(vocab) if vocab else 0)
    return flat


def make_llm(args: argparse.Namespace, name: str) -> LLM:
    return LLM(config=EngineConfig.from_flat(args.flat[name]))


def run_prompt(llm: LLM, name: str, workload: str, index: int, prompt: list[int], args) -> dict:
    run = run_one(llm, prompt, args.max_tokens, args.temperature)
    run.update(workload=workload, config=name, prompt=index, prompt_tokens=len(prompt))
    print(f"{workload} #{index} {name}: {rate(run):.2f} tok/s", flush=True)
    return run


def bench(args: argparse.Namespace) -> list[dict]:
    """Every (workload, prompt, config) run, with `identical_to_off` set."""
    torch.set_num_threads(args.threads)
    runs: list[dict] = []
    if args.interleave:
        engines = {name: make_llm(args, name) for name in args.configs}
        prompts = load_workloads(engines["off"], args)
        for llm in engines.values():
            warm_up(llm, prompts)
        for turn, (workload, index, prompt) in enumerate(prompts):
            runs += [
                run_prompt(engines[n], n, workload, index, prompt, args)
                for n in turn_order(args.configs, turn)
            ]
    else:
        prompts = None
        for name in args.configs:  # one engine at a time
            llm = make_llm(args, name)
            prompts = prompts or load_workloads(llm, args)
            warm_up(llm, prompts)
            runs += [run_prompt(llm, name, w, i, prompt, args) for w, i, prompt in prompts]
            del llm
            gc.collect()
    off = {(r["workload"], r["prompt"]): r["token_ids"] for r in runs if r["config"] == "off"}
    for run in runs:
        run["identical_to_off"] = run.pop("token_ids") == off[(run["workload"], run["prompt"])]
    return runs


def load_workloads(llm: LLM, args: argparse.Namespace) -> list[tuple[str, int, list[int]]]:
    """(workload, index, chat-templated prompt ids) for every prompt, workload by workload."""
    prompts = []
    for workload in args.workloads:
        if workload == "mixed":
            pairs = zip(*(read_prompts(llm, name, args.num_prompts) for name in MIXED))
            turns = [prompt for pair in pairs for prompt in pair]
            prompts += [(workload, index, prompt) for index, prompt in enumerate(turns)]
        else:
            read = read_prompts(llm, workload, args.num_prompts)
            prompts += [(workload, index, prompt) for index, prompt in enumerate(read)]
    return prompts


def read_prompts(llm: LLM, workload: str, count: int) -> list[list[int]]:
    """The first `count` prompts of a workload file, chat-templated token ids."""
    lines = [line for line in WORKLOADS[workload].read_text().splitlines() if line.strip()]
    messages = ([{"role": "user", "content": json.loads(line)["prompt"]}] for line in lines[:count])
    return [llm.tokenizer.apply_chat_template(m) for m in messages]


def warm_up(llm: LLM, prompts: list[tuple[str, int, list[int]]]) -> None:
    """First-step costs and lazy allocations, outside the timed runs."""
    run_one(llm, prompts[0][2][:64], 8)


def comparisons(runs: list[dict], rows: list[dict]) -> list[dict]:
    """Per workload, each `auto` config's decode rate over each single-proposer config's
    (the best of them marked), with a 90% interval from resampling whole prompts: both
    configs' runs of a drawn prompt are kept together (paired), so the machine's drift
    between prompts cancels."""
    found = []
    for workload in dict.fromkeys(row["workload"] for row in rows):
        mine = [row for row in rows if row["workload"] == workload and row["config"] != "off"]
        singles = [row for row in mine if not row["config"].startswith("auto")]
        best = max(singles, key=lambda row: row["tok_s"], default=None)
        for auto in (row for row in mine if row["config"].startswith("auto")):
            for single in singles:
                pairs = _paired(runs, workload, auto["config"], single["config"])
                found.append(
                    dict(
                        workload=workload,
                        config=auto["config"],
                        versus=single["config"],
                        best=single is best,
                        ratio=_rate_ratio(pairs),
                        interval=bootstrap_interval(pairs, _rate_ratio),
                    )
                )
    return found


def pooled(run_sets: list[list[dict]]) -> list[dict]:
    """One run per (workload, config, prompt), its decode tokens and seconds summed over the
    sets (repeats of one command): resampling whole prompts then keeps a prompt's repeats
    together, and repeating narrows the interval by averaging each prompt's timing noise."""
    merged: dict[tuple, dict] = {}
    for runs in run_sets:
        for run in runs:
            key = (run["workload"], run["config"], run["prompt"])
            workload, config, prompt = key
            into = merged.setdefault(
                key,
                dict(workload=workload, config=config, prompt=prompt, decode_tokens=0,
                     decode_seconds=0.0),
            )  # fmt: skip
            into["decode_tokens"] += run["decode_tokens"]
            into["decode_seconds"] += run["decode_seconds"]
    return list(merged.values())


def config_rates(runs: list[dict]) -> list[dict]:
    """Decode tok/s per (workload, config): the rows comparisons() reads."""
    totals: dict[tuple[str, str], list[float]] = {}
    for run in runs:
        total = totals.setdefault((run["workload"], run["config"]), [0, 0.0])
        total[0] += run["decode_tokens"]
        total[1] += run["decode_seconds"]
    return [dict(workload=w, config=c, tok_s=t / s) for (w, c), (t, s) in totals.items()]


def _paired(runs: list[dict], workload: str, a: str, b: str) -> list[tuple[dict, dict]]:
    """(a's run, b's run) of each prompt of the workload."""
    by = {(r["config"], r["prompt"]): r for r in runs if r["workload"] == workload}
    return [(by[(a, p)], by[(b, p)]) for c, p in by if c == a and (b, p) in by]


def _rate_ratio(pairs: list[tuple[dict, dict]]) -> float:
    """Total decode tok/s of the first runs over that of the second."""
    rates = [
        sum(pair[i]["decode_tokens"] for pair in pairs)
        / sum(pair[i]["decode_seconds"] for pair in pairs)
        for i in (0, 1)
    ]
    return rates[0] / rates[1]


def markdown(args: argparse.Namespace, rows: list[dict], command: str) -> str:
    decoding = f"sampled at T = {args.temperature}, one seed" if args.temperature else "greedy"
    lines = [
        f"`{command}` — {datetime.now().isoformat(timespec='seconds')}, "
        f"{machine_description()}, {load_average()} at the end, "
        f"{args.threads} thread(s); target {Path(args.target).name}, draft "
        f"{Path(args.draft).name}, weights gguf; batch 1, {decoding}, {args.max_tokens} new tokens, "
        f"{args.num_prompts} prompt(s) per workload. Decode tok/s excludes prefill; "
        "acceptance = accepted / drafted; accepted/step = mean accepted drafts per verify step.",
        "",
        "| workload | config | tok/s | speedup vs off | acceptance | accepted/step | identical |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        acceptance = "-" if row["acceptance"] is None else f"{row['acceptance']:.2f}"
        per_step = "-" if row["accepted_per_step"] is None else f"{row['accepted_per_step']:.2f}"
        lines.append(
            f"| {row['workload']} | {row['config']} | {row['tok_s']:.2f} | {row['speedup']:.2f}x "
            f"| {acceptance} | {per_step} | {'yes' if row['identical'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def comparison_markdown(found: list[dict]) -> str:
    if not found:
        return ""
    lines = [
        "",
        "auto over each single proposer (decode tok/s ratio; 90% interval from resampling "
        "whole prompts, paired; * = the best single one on that workload):",
        "",
        "| workload | config | over | ratio | 90% interval |",
        "|---|---|---|---|---|",
    ]
    for c in found:
        interval = "-" if c["interval"] is None else "{:.3f}-{:.3f}".format(*c["interval"])
        mark = " *" if c["best"] else ""
        lines.append(
            f"| {c['workload']} | {c['config']} | {c['versus']}{mark} | {c['ratio']:.3f} "
            f"| {interval} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.pool:
        runs = pooled([json.loads(Path(path).read_text())["runs"] for path in args.pool])
        print(comparison_markdown(comparisons(runs, config_rates(runs))))
        return 0
    command = " ".join(shlex.quote(a) for a in ["python", *sys.argv])
    runs = bench(args)
    rows = summarize(runs, args)
    found = comparisons(runs, rows)
    text = markdown(args, rows, command) + comparison_markdown(found)
    if args.out:
        results = dict(command=command, runs=runs, rows=rows, comparisons=found)
        Path(args.out).write_text(json.dumps(results, indent=2))
    print(text)
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
