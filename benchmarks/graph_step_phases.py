"""Where a replayed batch-1 step's time goes on the GPU machine: host phases of
StepGraphRunner.run, timed apart, with and without waiting for the GPU after each.

For a model on FlashInfer with CUDA graphs, decode (1 row) and verify (1 + k rows) steps at
batch 1: pad (pad_uniform), stage (pinned copy), plan (FlashInfer's plan_graph), replay
(graph launch), gather + logits (index_select, lm_head), sample (argmax to the host). "host"
columns: perf_counter around each call, no sync; "synced": each phase followed by
torch.cuda.synchronize(), so a phase that waits for the GPU shows up.

    python benchmarks/graph_step_phases.py --model M.gguf --out phases.json
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

from benchmarks.gpu_bench import BLOCK_SIZE, DecodeBatch  # noqa: E402
from engine.models.loader import load_model  # noqa: E402
from kernels.cuda_graphs import StepGraphRunner  # noqa: E402
from kernels.graph_shapes import GraphShapes  # noqa: E402
from kernels.registry import make_attention_backend  # noqa: E402

PHASES = ("pad", "stage", "plan", "replay", "logits", "sample")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def timed_step(runner: StepGraphRunner, model, inputs, sync: bool) -> dict[str, float]:
    ids, positions, metadata = inputs
    marks, times = [time.perf_counter()], {}

    def mark(name: str) -> None:
        if sync:
            torch.cuda.synchronize()
        marks.append(time.perf_counter())
        times[name] = 1e3 * (marks[-1] - marks[-2])

    shape = runner.shapes.padded(metadata.num_requests, max(metadata.query_lens_host))
    padded = runner._pad(metadata, *shape)
    mark("pad")
    n = padded.num_rows
    rows = torch.arange(metadata.num_tokens)
    runner._stage(padded, ids, positions, padded.rows[rows.numpy()])
    mark("stage")
    runner.backend.plan_graph(padded.metadata, runner._kv_rows(n))
    mark("plan")
    hidden = runner._replay(shape, n)
    mark("replay")
    logits = model.compute_logits(hidden.index_select(0, runner._gather(n, len(rows))))
    mark("logits")
    logits.argmax(-1).tolist()
    mark("sample")
    return times


def main() -> None:
    args = parse_args()
    device, dtype = torch.device("cuda"), torch.bfloat16
    backend = make_attention_backend("flashinfer", device, dtype)
    model = load_model(args.model, dtype, device, backend)[0]
    pages = -(-(args.context + args.steps * 8 + 16) // BLOCK_SIZE)
    backend.allocate(model.kv_cache_spec(pages + 1, BLOCK_SIZE, dtype, device))
    config = model.config
    runner = StepGraphRunner(
        backend,
        model,
        GraphShapes((1,), 5),
        num_heads=config.num_heads,
        max_model_len=config.max_position_embeddings,
        sm_scale=config.head_dim**-0.5,
    )
    runner.capture()
    batch = DecodeBatch(1, args.context, pages, config.vocab_size)
    result = {}
    with torch.inference_mode():
        for sync in (False, True):
            samples = [timed_step(runner, model, batch.inputs(i), sync) for i in range(args.steps)]
            key = "synced" if sync else "host"
            result[key] = {p: statistics.median(s[p] for s in samples[5:]) for p in PHASES}
            result[key]["total"] = sum(result[key].values())
    result["device"] = torch.cuda.get_device_name()
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
