"""Decode throughput on a GPU: reference attention vs FlashInfer (eager) vs FlashInfer + CUDA graphs.

Model: Llama-3.2-1B-shaped, random bf16 weights built in memory (16 layers, hidden 2048, 32 query
/ 8 KV heads of 64, FFN 8192, vocab 128256: 1.24 B parameters); engine/models/llama.py with the
backend under test. For each batch size B, B requests whose KV history is already --context
tokens long (the cache contents do not change the work) decode --steps tokens each; every step
plans the batch, runs the model, takes the argmax and copies it to the host (the engine's one
sync per step). Reported: B * steps / seconds, and prefill tok/s of one --prefill-tokens prompt.

Run by benchmarks/gpu_bench.sh; writes gpu_bench.json and gpu_bench.md into --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch

from engine.models.arch_config import ModelArchConfig
from engine.models.llama import LlamaForCausalLM
from kernels.attention import AttentionMetadata
from kernels.cuda_graphs import DecodeGraphRunner
from kernels.registry import make_attention_backend

BLOCK_SIZE = 16
DEVICE = torch.device("cuda")  # --device cpu: a quick dry run of this script without a GPU
LLAMA_1B = dict(
    vocab_size=128256,
    hidden_size=2048,
    intermediate_size=8192,
    num_layers=16,
    num_heads=32,
    num_kv_heads=8,
    head_dim=64,
    rope_theta=500000.0,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backends", default="reference,flashinfer,flashinfer+graphs")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=LLAMA_1B["num_layers"])
    parser.add_argument("--device", default="cuda")
    return parser.parse_args()


def build_model(backend, num_layers: int, dtype: torch.dtype) -> LlamaForCausalLM:
    """Random weights (std 0.02, norms 1) without a checkpoint; same build path as the loader."""
    config = ModelArchConfig(**{**LLAMA_1B, "num_layers": num_layers})
    with torch.device("meta"):
        model = LlamaForCausalLM(config, backend).to(dtype)
    model.to_empty(device=DEVICE)
    model.rotary.reset()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02)
    return model.eval().requires_grad_(False)


class DecodeBatch:
    """batch_size requests, each owning a contiguous run of pages_per_request blocks."""

    def __init__(self, batch_size: int, context: int, pages_per_request: int) -> None:
        self.batch_size, self.context = batch_size, context
        self.pages = pages_per_request
        blocks = torch.arange(batch_size * pages_per_request, dtype=torch.int32)
        self.block_tables = blocks.view(batch_size, pages_per_request).to(DEVICE)
        self.tokens = [1] * batch_size

    def inputs(self, step: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Input ids, positions and metadata of decode step `step` (history context + step)."""
        position = self.context + step
        slots = [b * self.pages * BLOCK_SIZE + position for b in range(self.batch_size)]
        n = self.batch_size
        metadata = AttentionMetadata(
            query_start_loc=torch.arange(n + 1, dtype=torch.int32).to(DEVICE),
            seq_lens=torch.full((n,), position + 1, dtype=torch.int32).to(DEVICE),
            block_tables=self.block_tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64).to(DEVICE),
            query_lens_host=(1,) * n,
            seq_lens_host=(position + 1,) * n,
        )
        ids = torch.tensor(self.tokens, dtype=torch.int64).to(DEVICE)
        return ids, torch.full((n,), position, dtype=torch.int64).to(DEVICE), metadata


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def eager_step(model: LlamaForCausalLM):
    def step(ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata):
        model.backend.plan(metadata)
        return model.compute_logits(model(ids, positions))

    return step


def graph_step(model: LlamaForCausalLM, batch_sizes: tuple[int, ...]):
    config = model.config
    runner = DecodeGraphRunner(
        model.backend,
        lambda ids, positions: model.compute_logits(model(ids, positions)),
        num_heads=config.num_heads,
        max_model_len=config.max_position_embeddings,
        batch_sizes=batch_sizes,
    )
    runner.capture()
    return runner.run


@torch.inference_mode()
def decode_tok_s(step, batch: DecodeBatch, steps: int, warmup: int) -> float:
    for i in range(warmup + steps):
        if i == warmup:
            sync()
            start = time.perf_counter()
        logits = step(*batch.inputs(i))
        batch.tokens = logits.argmax(-1).tolist()  # the engine's one host sync per step
    sync()
    return batch.batch_size * steps / (time.perf_counter() - start)


@torch.inference_mode()
def prefill_tok_s(model: LlamaForCausalLM, num_tokens: int, repeats: int = 3) -> float:
    pages = -(-num_tokens // BLOCK_SIZE)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32).to(DEVICE),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32).to(DEVICE),
        block_tables=torch.arange(pages, dtype=torch.int32).view(1, pages).to(DEVICE),
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64).to(DEVICE),
        query_lens_host=(num_tokens,),
        seq_lens_host=(num_tokens,),
    )
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,)).to(DEVICE)
    positions = torch.arange(num_tokens).to(DEVICE)
    step = eager_step(model)
    times = []
    for _ in range(repeats + 1):  # the first run warms up (and JIT-compiles)
        sync()
        start = time.perf_counter()
        step(ids, positions, metadata)[-1:].argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    return num_tokens / min(times[1:])


def run_backend(name: str, args, batch_sizes: tuple[int, ...]) -> dict:
    dtype = torch.bfloat16
    backend = make_attention_backend(name.split("+")[0], DEVICE, dtype)
    model = build_model(backend, args.num_layers, dtype)
    pages = -(-(args.context + args.warmup + args.steps + 1) // BLOCK_SIZE)
    num_blocks = max(batch_sizes) * pages + 1
    backend.allocate(model.kv_cache_spec(num_blocks, BLOCK_SIZE, dtype, DEVICE))
    step = graph_step(model, batch_sizes) if name.endswith("+graphs") else eager_step(model)
    result = {"prefill_tok_s": prefill_tok_s(model, args.prefill_tokens), "decode_tok_s": {}}
    for size in batch_sizes:
        batch = DecodeBatch(size, args.context, pages)
        result["decode_tok_s"][size] = decode_tok_s(step, batch, args.steps, args.warmup)
        print(f"{name:18s} batch {size:3d}: {result['decode_tok_s'][size]:9.1f} tok/s", flush=True)
    del model, backend, step
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    return result


def markdown(results: dict, meta: dict) -> str:
    names = list(results)
    sizes = list(next(iter(results.values()))["decode_tok_s"])
    base = results.get("reference")
    others = [n for n in names if n != "reference"] if base else []
    header = ["batch", *(f"{n} tok/s" for n in names), *(f"{n} / reference" for n in others)]
    lines = [
        f"# GPU decode benchmark ({meta['date']})",
        "",
        f"{meta['device']}, torch {meta['torch']}, flashinfer {meta['flashinfer']}; "
        f"{meta['model']}; context {meta['context']}, {meta['steps']} steps; "
        f"command: `{meta['command']}`",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for size in sizes:
        cells = [f"{results[n]['decode_tok_s'][size]:.1f}" for n in names]
        cells += [
            f"{results[n]['decode_tok_s'][size] / base['decode_tok_s'][size]:.2f}x" for n in others
        ]
        lines.append(f"| {size} | " + " | ".join(cells) + " |")
    lines += ["", "| backend | prefill tok/s |", "|---|---|"]
    lines += [f"| {n} | {results[n]['prefill_tok_s']:.0f} |" for n in names]
    return "\n".join(lines) + "\n"


def main() -> None:
    global DEVICE
    args = parse_args()
    DEVICE = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    results = {}
    for name in args.backends.split(","):
        try:
            results[name] = run_backend(name, args, batch_sizes)
        except Exception as exc:  # one failing backend must not lose the others' numbers
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    try:
        import flashinfer

        fi_version = flashinfer.__version__
    except Exception:
        fi_version = "not importable"
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "flashinfer": fi_version,
        "model": f"Llama-1B-shaped random bf16, {args.num_layers} layers",
        "context": args.context,
        "steps": args.steps,
        "command": "bash benchmarks/gpu_bench.sh bench",
    }
    (args.out / "gpu_bench.json").write_text(
        json.dumps({"meta": meta, "results": results}, indent=1)
    )
    if results:
        (args.out / "gpu_bench.md").write_text(markdown(results, meta))


if __name__ == "__main__":
    main()
