"""Microbenchmark: a GGUF model's linear layers per step on the native CPU kernels.

One "step" runs every linear layer of the model once on M rows, as the model calls them
(per layer the fused q|k|v, o, the fused gate|up and down, then the output head), with the
GGUF's own blocks, through `engine.models.linear.QuantLinear` (so the packed tiles and the
per-format runs are exactly the model's). Activation modes (`--modes`):
  float32   float32 activations: AVX-512 tiles for Q4_0 / Q4_1 / Q8_0, else the blocks on AVX2
  int16     rows quantized to 16 bits per group of 32, integer tiles (the default path)
  int8      rows quantized to 8 bits per group of 32 (llama.cpp's arithmetic), integer tiles
  int16-avx2 / int8-avx2 / float32-avx2   the same, capped at the AVX2 kernels
Before timing it measures the machine's read bandwidth (benchmarks/decode_bound.py)
and prints the bytes one step reads and the M = 1 bound they imply. Repeats are interleaved
(every configuration once per round, then the next round) and the median is reported.

    python benchmarks/cpu_kernels.py                                  # SmolLM2 (embedded)
    python benchmarks/cpu_kernels.py --model ~/.cache/goodspeed/models/qwen-pair/\\
        qwen2.5-coder-1.5b-instruct-q4_k_m.gguf --rows 1 4 16 128 512 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decode_bound import read_bandwidth  # noqa: E402
from benchmarks.report import load_average, machine_description  # noqa: E402
from engine.models.gguf_file import read_gguf  # noqa: E402
from engine.models.linear import QuantLinear  # noqa: E402
from engine.models.loader import resolve_model_path  # noqa: E402
from kernels.cpu import ISA, QuantizedWeight, load_native  # noqa: E402

# Per layer, in call order: the GGUF tensors fused into each of the model's linear layers.
FUSED = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
MODES = ("float32", "int16", "int8", "float32-avx2", "int16-avx2", "int8-avx2")


def model_layers(path: Path) -> list[QuantLinear]:
    """The model's linear layers in call order, fused like the model fuses them."""
    tensors = {t.name: t for t in read_gguf(path).tensors}

    def weight(name: str) -> QuantizedWeight:
        t = tensors[name]
        return QuantizedWeight(t.ggml_type, torch.from_numpy(t.data.copy()), t.shape[1])

    num_layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    layers = []
    for i in range(num_layers):
        for parts in FUSED:
            layers.append(QuantLinear([weight(f"blk.{i}.{p}.weight") for p in parts]))
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"  # tied
    layers.append(QuantLinear([weight(head)]))
    for layer in layers:
        for run in layer.runs:  # pack and concatenate before timing
            run.tiles()
            run.blocks()
    return layers


def step_bytes(layers: list[QuantLinear]) -> int:
    return sum(run.blocks().data.numel() for layer in layers for run in layer.runs)


def step_fn(layers: list[QuantLinear], rows: int, mode: str) -> Callable[[], None]:
    ops = load_native()
    act, _, cap = mode.partition("-")
    isa = ISA[cap or "auto"]
    inputs = {k: torch.randn(rows, k) for k in {layer.in_features for layer in layers}}
    outs = [torch.empty(rows, layer.out_features) for layer in layers]
    calls = []
    for layer, out in zip(layers, outs):
        for run in layer.runs:
            target = out[:, run.columns]
            tiles = run.tiles() if (act != "float32" or isa != ISA["avx2"]) else None
            calls.append((inputs[layer.in_features], run.blocks(), target, tiles))
    code = {"float32": 0, "int8": 1, "int16": 2}[act]

    def run() -> None:
        for x, weight, target, tiles in calls:
            ops.qlinear_out(x, weight.data, weight.qtype, None, target, isa, code, tiles)

    return run


def timed(fn: Callable) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(layers, rows_list, modes, threads, rounds) -> dict:
    configs = {(rows, mode): step_fn(layers, rows, mode) for rows in rows_list for mode in modes}
    torch.set_num_threads(threads)
    samples: dict[tuple, list[float]] = {key: [] for key in configs}
    for fn in configs.values():  # warm-up: page in weights, build thread pools
        fn()
    for _ in range(rounds):
        for key, fn in configs.items():
            samples[key].append(timed(fn))
    return {key: statistics.median(times) * 1e3 for key, times in samples.items()}


def table(ms: dict, rows_list: list[int], modes: list[str], bound_ms: float) -> str:
    head = "| M | " + " | ".join(f"{m} ms" for m in modes) + " | int16 ms/row | int16 / bound |"
    lines = [head, "|" + "---|" * (len(modes) + 3)]
    for rows in rows_list:
        cells = [f"{ms[(rows, m)]:.1f}" for m in modes]
        int16 = ms.get((rows, "int16"), float("nan"))
        lines.append(
            f"| {rows} | " + " | ".join(cells) + f" | {int16 / rows:.2f} | "
            f"{int16 / bound_ms:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8, 16, 128])
    parser.add_argument(
        "--modes", default="float32,int16,int8", help="comma list of " + ",".join(MODES)
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if load_native() is None:
        raise SystemExit("the native kernels did not build (see the warning above)")
    path = (
        Path(args.model).expanduser() if args.model else resolve_model_path("smollm2-135m-instruct")
    )
    modes = args.modes.split(",")
    before = load_average()
    bandwidth = read_bandwidth(args.threads) / 1e9
    layers = model_layers(path)
    nbytes = step_bytes(layers)
    bound_ms = nbytes / bandwidth / 1e6
    ms = run(layers, args.rows, modes, args.threads, args.rounds)
    print(f"command: `python {' '.join(sys.argv)}`  ")
    print(f"machine: {machine_description()}  ")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {args.threads} threads  ")
    print(f"load average (1/5/15 min): before {before}, after {load_average()}  ")
    print(
        f"model: {path.name}; one step reads {nbytes / 1e6:.0f} MB of weights; read bandwidth "
        f"{bandwidth:.1f} GB/s -> M = 1 bound {bound_ms:.1f} ms  "
    )
    print(f"median of {args.rounds} interleaved rounds\n")
    print(table(ms, args.rows, modes, bound_ms))


if __name__ == "__main__":
    main()
