"""Decode throughput on a GPU: reference attention vs FlashInfer (eager) vs FlashInfer + CUDA
graphs vs HF transformers `generate`.

Model (--model): `llama1b` = Llama-3.2-1B-shaped, random bf16 weights built in memory (16
layers, hidden 2048, 32 query / 8 KV heads of 64, FFN 8192, vocab 128256: 1.24 B parameters),
or a .gguf file / HF directory (SmolLM2). engine/models/llama.py runs with the backend under
test: for each batch size B, B requests whose KV history is already --context tokens long (the
cache contents do not change the work) decode --steps tokens each; every step plans the batch,
runs the model, takes the argmax and copies it to the host (the engine's one sync per step).
Reported: B * steps / seconds; prefill tok/s of one --prefill-tokens prompt; and the batch-1
bounds (gpu_bounds.py): HBM roofline (weight bytes / measured copy bandwidth) and launch bound
(kernels of one eager step x the measured time per node of a replayed graph).

Run by benchmarks/gpu_bench.sh; writes gpu_bench[_NAME].json and .md into --out.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gpu_bounds  # noqa: E402
from benchmarks.gpu_report import markdown  # noqa: E402
from engine.models.arch_config import ModelArchConfig  # noqa: E402
from engine.models.llama import LlamaForCausalLM  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from kernels.attention import AttentionMetadata  # noqa: E402
from kernels.cuda_graphs import StepGraphRunner  # noqa: E402
from kernels.graph_shapes import GraphShapes  # noqa: E402
from kernels.registry import make_attention_backend  # noqa: E402

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
    parser.add_argument("--model", default="llama1b", help="llama1b, or a .gguf / HF dir path")
    parser.add_argument("--name", default="", help="suffix of the output files")
    parser.add_argument("--backends", default="reference,flashinfer,flashinfer+graphs,hf")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32,64")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=LLAMA_1B["num_layers"])
    parser.add_argument("--device", default="cuda")
    return parser.parse_args()


def build_model(backend, args, dtype: torch.dtype) -> LlamaForCausalLM:
    """The checkpoint at --model, or random weights (std 0.02, norms 1) for llama1b."""
    if args.model != "llama1b":
        return load_model(args.model, dtype, DEVICE, backend)[0]
    config = ModelArchConfig(**{**LLAMA_1B, "num_layers": args.num_layers})
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

    def __init__(self, batch_size: int, context: int, pages_per_request: int, vocab: int) -> None:
        self.batch_size, self.context = batch_size, context
        self.pages = pages_per_request
        blocks = torch.arange(batch_size * pages_per_request, dtype=torch.int32)
        self.block_tables = blocks.view(batch_size, pages_per_request)
        self.tokens = torch.randint(3, vocab, (batch_size,)).tolist()

    def inputs(self, step: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        """Host input ids, positions and metadata of decode step `step` (history context +
        step), as the engine's ModelInput holds them."""
        position = self.context + step
        slots = [b * self.pages * BLOCK_SIZE + position for b in range(self.batch_size)]
        n = self.batch_size
        metadata = AttentionMetadata(
            query_start_loc=torch.arange(n + 1, dtype=torch.int32),
            seq_lens=torch.full((n,), position + 1, dtype=torch.int32),
            block_tables=self.block_tables,
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_lens_host=(1,) * n,
            seq_lens_host=(position + 1,) * n,
        )
        ids = torch.tensor(self.tokens, dtype=torch.int64)
        return ids, torch.full((n,), position, dtype=torch.int64), metadata


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def on_device(metadata: AttentionMetadata) -> AttentionMetadata:
    return dataclasses.replace(
        metadata,
        query_start_loc=metadata.query_start_loc.to(DEVICE),
        seq_lens=metadata.seq_lens.to(DEVICE),
        block_tables=metadata.block_tables.to(DEVICE),
        slot_mapping=metadata.slot_mapping.to(DEVICE),
    )


def eager_step(model: LlamaForCausalLM):
    def step(ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata):
        model.backend.plan(on_device(metadata))
        return model.compute_logits(model(ids.to(DEVICE), positions.to(DEVICE)))

    return step


def graph_step(model: LlamaForCausalLM, batch_sizes: tuple[int, ...]):
    """The engine's graph path: the model step replayed, then the logits of the gathered rows
    (here every row) outside the graph."""
    config = model.config
    runner = StepGraphRunner(
        model.backend,
        model,
        GraphShapes(batch_sizes, 1),
        num_heads=config.num_heads,
        max_model_len=config.max_position_embeddings,
        sm_scale=config.head_dim**-0.5,
    )
    runner.capture()

    def step(ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata):
        rows = torch.arange(metadata.num_tokens)
        return model.compute_logits(runner.run(ids, positions, metadata, rows))

    return step


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
        query_start_loc=torch.tensor([0, num_tokens], dtype=torch.int32),
        seq_lens=torch.tensor([num_tokens], dtype=torch.int32),
        block_tables=torch.arange(pages, dtype=torch.int32).view(1, pages),
        slot_mapping=torch.arange(num_tokens, dtype=torch.int64),
        query_lens_host=(num_tokens,),
        seq_lens_host=(num_tokens,),
    )
    ids = torch.randint(0, model.config.vocab_size, (num_tokens,))
    positions = torch.arange(num_tokens)
    step = eager_step(model)
    times = []
    for _ in range(repeats + 1):  # the first run warms up (and JIT-compiles)
        sync()
        start = time.perf_counter()
        step(ids, positions, metadata)[-1:].argmax(-1).tolist()
        times.append(time.perf_counter() - start)
    return num_tokens / min(times[1:])


def run_backend(name: str, args, batch_sizes: tuple[int, ...]) -> dict:
    if name == "hf":
        return run_hf(args, batch_sizes)
    dtype = torch.bfloat16
    backend = make_attention_backend(name.split("+")[0], DEVICE, dtype)
    model = build_model(backend, args, dtype)
    vocab = model.config.vocab_size
    pages = -(-(args.context + args.warmup + args.steps + 1) // BLOCK_SIZE)
    num_blocks = max(batch_sizes) * pages + 1
    backend.allocate(model.kv_cache_spec(num_blocks, BLOCK_SIZE, dtype, DEVICE))
    step = graph_step(model, batch_sizes) if name.endswith("+graphs") else eager_step(model)
    result = {"prefill_tok_s": prefill_tok_s(model, args.prefill_tokens), "decode_tok_s": {}}
    for size in batch_sizes:
        batch = DecodeBatch(size, args.context, pages, vocab)
        result["decode_tok_s"][size] = decode_tok_s(step, batch, args.steps, args.warmup)
        print(f"{name:18s} batch {size:3d}: {result['decode_tok_s'][size]:9.1f} tok/s", flush=True)
    if DEVICE.type == "cuda":
        result["host_ms"] = host_ms(step, DecodeBatch(1, args.context, pages, vocab))
    if name == "flashinfer" and DEVICE.type == "cuda":
        inputs = DecodeBatch(1, args.context, pages, vocab).inputs(0)
        result["kernels_per_step"] = gpu_bounds.count_kernels(step, inputs)
        result["weight_bytes"] = gpu_bounds.weight_bytes(model)
    return result


@torch.inference_mode()
def host_ms(step, batch: DecodeBatch, repeats: int = 20) -> dict:
    """Batch-1 host time (ms, median): building the inputs, and the step call itself before
    its GPU work is waited for (plan + launches / graph replay)."""
    inputs_times, step_times = [], []
    for i in range(repeats):
        sync()
        start = time.perf_counter()
        inputs = batch.inputs(i)
        middle = time.perf_counter()
        step(*inputs)
        end = time.perf_counter()
        sync()
        inputs_times.append(middle - start)
        step_times.append(end - middle)
    median = lambda xs: 1e3 * sorted(xs)[len(xs) // 2]  # noqa: E731
    return {"inputs": median(inputs_times), "step_call": median(step_times)}


def run_hf(args, batch_sizes: tuple[int, ...]) -> dict:
    model = gpu_bounds.hf_model_for(
        args.model, torch.bfloat16, {**LLAMA_1B, "num_layers": args.num_layers}
    )
    vocab = model.config.vocab_size
    result = {"decode_tok_s": {}}
    for size in batch_sizes:
        tok_s = gpu_bounds.hf_decode_tok_s(model, size, args.context, args.steps, vocab)
        result["decode_tok_s"][size] = tok_s
        print(f"{'hf':18s} batch {size:3d}: {tok_s:9.1f} tok/s", flush=True)
    del model
    torch.cuda.empty_cache()
    return result


def bounds(results: dict) -> dict:
    """Batch-1 step times: measured (graphs), HBM roofline, launch bound (see gpu_bounds)."""
    eager = results.get("flashinfer", {})
    graphs = results.get("flashinfer+graphs", {})
    if "weight_bytes" not in eager or 1 not in graphs.get("decode_tok_s", {}):
        return {}
    bandwidth = gpu_bounds.hbm_bandwidth()
    node_seconds = gpu_bounds.graph_node_seconds()
    return {
        "hbm_bytes_per_s": bandwidth,
        "weight_bytes": eager["weight_bytes"],
        "roofline_ms": 1e3 * eager["weight_bytes"] / bandwidth,
        "kernels_per_step": eager["kernels_per_step"],
        "graph_node_us": 1e6 * node_seconds,
        "launch_bound_ms": 1e3 * eager["kernels_per_step"] * node_seconds,
        "graphs_step_ms": 1e3 / graphs["decode_tok_s"][1],
    }


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
            if DEVICE.type == "cuda":
                torch.cuda.empty_cache()
        except Exception as exc:  # one failing backend must not lose the others' numbers
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    limits = bounds(results) if DEVICE.type == "cuda" else {}
    try:
        import flashinfer

        fi_version = flashinfer.__version__
    except Exception:
        fi_version = "not importable"
    model = f"Llama-1B-shaped random bf16, {args.num_layers} layers"
    meta = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "flashinfer": fi_version,
        "model": model if args.model == "llama1b" else f"{Path(args.model).name} in bf16",
        "context": args.context,
        "steps": args.steps,
        "command": f"bash benchmarks/gpu_bench.sh bench --model {args.model}",
    }
    suffix = f"_{args.name}" if args.name else ""
    payload = {"meta": meta, "results": results, "bounds": limits}
    (args.out / f"gpu_bench{suffix}.json").write_text(json.dumps(payload, indent=1))
    if results:
        text = markdown(results, meta, limits)
        (args.out / f"gpu_bench{suffix}.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
