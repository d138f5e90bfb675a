"""CPU paged attention: the AVX-512 path (one task per token and KV head) against the AVX2 path
(one task per token and query head), interleaved in one process (`set_attention_isa_cap`).

`--mode kernel`: SmolLM2's shapes (9 query heads, 3 KV heads, head_dim 64, 30 layers), one
request with `--ctx` positions and `--tokens` new tokens (1 = a decode, more = a verify chain),
its blocks scattered; ms per step over the 30 layers, median of `--rounds`, "cold" after a
100 MB write evicts the caches (as the weights do in a real step), "hot" right after. Each
layer is one call from Python here (~10 us of call overhead each, ~0.3 ms per step on both
paths), where the native decoder stack calls the kernel from C++.

`--mode prefill`: one request's prefill chunk (`--tokens` new tokens after `--ctx` positions) on
a model's shapes (`--heads`, `--kv-heads`, `--head-dim`, `--layers`; default Qwen2.5-1.5B's),
under each kernel build of `--builds` (source hashes in the kernel cache, kernels/cpu/build.py;
default the current one) in turn: ms per chunk, median of `--rounds`, and whether every build's
output is bitwise the first's.

`--mode engine`: batch-1 greedy decode of chat-templated copy prompts (../shared/data), one
engine per (policy, path) in one process, prompts taking turns across them; tok/s and tok/step.

    .venv/bin/python benchmarks/cpu_attention.py --mode kernel --ctx 500 --tokens 1 6
    .venv/bin/python benchmarks/cpu_attention.py --mode prefill --ctx 0 512 --tokens 512 \
        --builds <old hash> <new hash>
    .venv/bin/python benchmarks/cpu_attention.py --mode engine --prompts 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.front.llm import LLM  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from kernels.cpu.build import DEFAULT_CACHE, build_dir, load_native  # noqa: E402
from kernels.cpu.build import load_build as cached_build  # noqa: E402

PATHS = {"avx2": 1, "avx512": 2}  # set_attention_isa_cap values
LAYERS, BLOCK, KV_HEADS, HEAD_DIM, HEADS = 30, 16, 3, 64, 9
DATA = ROOT.parent / "shared" / "data" / "workload_copy.jsonl"


def kernel_case(ops, ctx: int, tokens: int, rounds: int) -> dict[str, dict[str, float]]:
    blocks = (ctx + BLOCK - 1) // BLOCK + 1
    caches = [torch.randn(blocks, 2, BLOCK, KV_HEADS, HEAD_DIM) for _ in range(LAYERS)]
    order = torch.randperm(blocks).to(torch.int32)
    positions = range(ctx - tokens, ctx)
    slots = torch.tensor([int(order[p // BLOCK]) * BLOCK + p % BLOCK for p in positions])
    rows = torch.tensor([[0, ctx - tokens, j, tokens] for j in range(tokens)], dtype=torch.int32)
    q = torch.randn(tokens, HEADS, HEAD_DIM)
    k, v = torch.randn(tokens, KV_HEADS, HEAD_DIM), torch.randn(tokens, KV_HEADS, HEAD_DIM)
    out, flush = torch.empty_like(q), torch.randn(25_000_000)
    times = {(path, mode): [] for path in PATHS for mode in ("cold", "hot")}
    for _ in range(rounds):
        for path, cap in PATHS.items():
            ops.set_attention_isa_cap(cap)
            for mode in ("cold", "hot"):
                if mode == "cold":
                    flush.add_(1.0)
                start = time.perf_counter()
                for cache in caches:
                    ops.paged_attention_out(
                        q, k, v, cache, slots, order[None, :], rows, None, 0.125, out
                    )
                times[(path, mode)].append(time.perf_counter() - start)
    ops.set_attention_isa_cap(2)
    return {
        path: {mode: 1e3 * statistics.median(times[(path, mode)]) for mode in ("cold", "hot")}
        for path in PATHS
    }


def run_kernel(args: argparse.Namespace) -> None:
    ops = load_native()
    torch.set_num_threads(args.threads)
    print("| ctx | tokens | avx2 cold ms | avx512 cold ms | cold speed-up | avx2 hot ms "
          "| avx512 hot ms | hot speed-up |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for ctx in args.ctx:
        for tokens in args.tokens:
            r = kernel_case(ops, ctx, tokens, args.rounds)
            a, b = r["avx2"], r["avx512"]
            print(f"| {ctx} | {tokens} | {a['cold']:.3f} | {b['cold']:.3f} | "
                  f"{a['cold'] / b['cold']:.2f}x | {a['hot']:.3f} | {b['hot']:.3f} | "
                  f"{a['hot'] / b['hot']:.2f}x |", flush=True)  # fmt: skip


def load_build(source_hash: str):
    module = cached_build(source_hash)
    if module is None:
        sys.exit(f"no kernel build {source_hash} in {DEFAULT_CACHE}")
    return module


def prefill_case(builds: dict, args: argparse.Namespace, ctx: int) -> dict[str, float]:
    """Median ms of one chunk over the layers per build; exits if a build's output differs."""
    tokens, heads, kv_heads, dim = args.tokens[0], args.heads, args.kv_heads, args.head_dim
    blocks = (ctx + tokens + BLOCK - 1) // BLOCK
    caches = [torch.randn(blocks, 2, BLOCK, kv_heads, dim) for _ in range(args.layers)]
    order = torch.randperm(blocks).to(torch.int32)
    slots = torch.tensor(
        [int(order[p // BLOCK]) * BLOCK + p % BLOCK for p in range(ctx, ctx + tokens)]
    )
    rows = torch.tensor([[0, ctx, j, tokens] for j in range(tokens)], dtype=torch.int32)
    q = torch.randn(tokens, heads, dim)
    k, v = torch.randn(tokens, kv_heads, dim), torch.randn(tokens, kv_heads, dim)
    outs = {name: torch.empty_like(q) for name in builds}
    times = {name: [] for name in builds}
    for _ in range(args.rounds):
        for name, ops in builds.items():
            start = time.perf_counter()
            for cache in caches:
                ops.paged_attention_out(
                    q, k, v, cache, slots, order[None, :], rows, None, dim**-0.5, outs[name]
                )
            times[name].append(time.perf_counter() - start)
    first = next(iter(outs.values()))
    for name, out in outs.items():
        if not torch.equal(out, first):
            sys.exit(f"build {name}'s output differs from the first build's")
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def run_prefill(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    hashes = args.builds or [build_dir().name]
    builds = {h: (load_native() if h == build_dir().name else load_build(h)) for h in hashes}
    for ops in builds.values():
        ops.set_attention_isa_cap(args.isa)
    print("| ctx | tokens | " + " | ".join(f"{h} ms" for h in hashes) + " | ratio to the first |")
    print("|---|---|" + "---|" * (len(hashes) + 1))
    for ctx in args.ctx:
        r = prefill_case(builds, args, ctx)
        ratios = ", ".join(f"{r[hashes[0]] / r[h]:.2f}x" for h in hashes[1:])
        cells = " | ".join(f"{r[h]:.1f}" for h in hashes)
        print(f"| {ctx} | {args.tokens[0]} | {cells} | {ratios} |", flush=True)


def decode_one(engine, request_id: str, prompt: str) -> tuple[int, float, int]:
    """(tokens, seconds, steps) of one greedy 128-token completion, prefill excluded."""
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}])
    params = SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)
    engine.add_request(request_id, ids, params)
    engine.step()  # the prefill
    tokens = steps = 0
    start = time.perf_counter()
    while True:
        outputs = engine.step()
        steps += 1
        tokens += sum(len(o.new_token_ids) for o in outputs)
        if any(o.finished for o in outputs):
            return tokens, time.perf_counter() - start, steps


def run_engine(args: argparse.Namespace) -> None:
    ops = load_native()
    prompts = [json.loads(line)["prompt"] for line in DATA.read_text().splitlines()]
    engines = {}
    for policy in ("off", "goodput"):
        spec = {"spec_policy": "off"} if policy == "off" else {"proposer": "ngram"}
        for path in PATHS:
            llm = LLM(model=args.model, threads=args.threads, kv_cache_memory="256MiB", **spec)
            engines[(policy, path)] = llm.engine
    totals = {key: [0, 0.0, 0] for key in engines}
    for index, prompt in enumerate(prompts[: args.prompts]):
        for (policy, path), engine in engines.items():
            ops.set_attention_isa_cap(PATHS[path])
            result = decode_one(engine, f"r{index}", prompt)
            if index > 0:  # the first prompt warms the engines up
                totals[(policy, path)] = [t + r for t, r in zip(totals[(policy, path)], result)]
    ops.set_attention_isa_cap(2)
    print("| policy | path | tok/s | tok/step | avx512 / avx2 |")
    print("|---|---|---|---|---|")
    for (policy, path), (tokens, seconds, steps) in totals.items():
        base = totals[(policy, "avx2")]
        ratio = (tokens / seconds) / (base[0] / base[1])
        print(
            f"| {policy} | {path} | {tokens / seconds:.1f} | {tokens / steps:.2f} | {ratio:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["kernel", "prefill", "engine"], default="kernel")
    parser.add_argument("--ctx", type=int, nargs="+", default=[150, 500, 1000])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--heads", type=int, default=12, help="--mode prefill")
    parser.add_argument("--kv-heads", type=int, default=2, help="--mode prefill")
    parser.add_argument("--head-dim", type=int, default=128, help="--mode prefill")
    parser.add_argument("--layers", type=int, default=28, help="--mode prefill")
    parser.add_argument("--builds", nargs="*", default=[], help="--mode prefill: kernel hashes")
    parser.add_argument("--isa", type=int, default=2, help="--mode prefill: attention ISA cap")
    args = parser.parse_args()
    {"kernel": run_kernel, "prefill": run_prefill, "engine": run_engine}[args.mode](args)


if __name__ == "__main__":
    main()
