"""Microbenchmark: SmolLM2-135M's linear layers per step, native GGUF kernels vs float32.

One "step" runs every linear layer of the model once on M rows, as the model calls them
(30 x [qkv 960x576, o 576x576, gate_up 3072x576, down 576x1536] + lm_head 49152x576), with
the embedded GGUF's own blocks (Q4_1 layers, Q8_0 head). Implementations:
  native    kernels.cpu as QuantLinear calls it: the AVX-512 16-column tiles where the CPU has
            them (pack_tiles), else the blocks as stored; float32 activations;
  int8      the same with int8 activations (VNNI on the tiles, else the AVX2 int8 path);
  avx2      the blocks as stored on the AVX2 path (isa=2), float32 activations;
  F.linear  float32 weights dequantised once (what MKL does with today's float32 path);
  engine    engine.models.linear.linear, today's float32 path (W @ x^T for M <= 5);
  fallback  kernels.cpu.fallback: dequantise with `gguf` on every call, then F.linear.
Repeats are interleaved (every configuration once per round, then the next round) and the
median is reported. Prints a markdown table with the command, machine, date and load average.

    python benchmarks/cpu_kernels.py                   # threads 1 and 2 (capped at nproc)
    python benchmarks/cpu_kernels.py --rounds 9 --rows 1 5 --no-fallback
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.models.gguf_file import read_gguf  # noqa: E402
from engine.models.linear import linear as engine_linear  # noqa: E402
from engine.models.loader import resolve_model_path  # noqa: E402
from kernels.cpu import QuantizedWeight, concat_rows, fallback, load_native, pack_tiles  # noqa: E402

# Per layer, in call order: the GGUF tensors fused into each of the model's linear layers.
FUSED = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))


def smollm2_layers() -> list[QuantizedWeight]:
    """The model's linear layers in call order, fused like the model fuses them."""
    tensors = {t.name: t for t in read_gguf(resolve_model_path("smollm2-135m-instruct")).tensors}

    def weight(name: str) -> QuantizedWeight:
        t = tensors[name]
        return QuantizedWeight(t.ggml_type, torch.from_numpy(t.data.copy()), t.shape[1])

    num_layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("blk."))
    layers = []
    for i in range(num_layers):
        for parts in FUSED:
            layers.append(concat_rows([weight(f"blk.{i}.{p}.weight") for p in parts]))
    layers.append(weight("token_embd.weight"))  # the tied head
    return layers


def step_fns(layers: list[QuantizedWeight], rows: int, with_fallback: bool) -> dict[str, Callable]:
    """Implementation name -> a function running one step on `rows` rows."""
    ops = load_native()
    if ops is None:
        raise SystemExit("the native kernels did not build (see the warning above)")
    dense = [fallback.dequantize(w) for w in layers]
    inputs = {k: torch.randn(rows, k) for k in {w.in_features for w in layers}}
    outs = [torch.empty(rows, w.out_features) for w in layers]
    packed = [pack_tiles(w) for w in layers]

    def native(act: int = 0) -> None:
        for w, out, tiles in zip(layers, outs, packed):
            ops.qlinear_out(inputs[w.in_features], w.data, w.qtype, None, out, 0, act, tiles)

    def avx2() -> None:
        for w, out in zip(layers, outs):
            ops.qlinear_out(
                inputs[w.in_features], w.data, w.qtype, None, out, 2 if ops.cpu_has_avx2() else 1
            )

    def f_linear() -> None:
        for w in dense:
            F.linear(inputs[w.shape[1]], w)

    def engine() -> None:
        for w in dense:
            engine_linear(inputs[w.shape[1]], w)

    def per_call_fallback() -> None:
        for w in layers:
            fallback.qlinear(inputs[w.in_features], w)

    fns = {"native": native, "int8": lambda: native(1), "avx2": avx2, "F.linear": f_linear}
    fns["engine"] = engine
    if with_fallback:
        fns["fallback"] = per_call_fallback
    return fns


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(rows_list: list[int], threads_list: list[int], rounds: int, with_fallback: bool) -> dict:
    layers = smollm2_layers()
    configs = {}
    for rows in rows_list:
        for name, fn in step_fns(layers, rows, with_fallback).items():
            for threads in threads_list:
                configs[(rows, threads, name)] = fn
    samples: dict[tuple, list[float]] = {key: [] for key in configs}
    for key, fn in configs.items():  # warm-up: page in weights, build thread pools
        torch.set_num_threads(key[1])
        fn()
    for _ in range(rounds):
        for key, fn in configs.items():
            torch.set_num_threads(key[1])
            slow = key[2] == "fallback"
            if slow and len(samples[key]) >= max(1, rounds // 3):
                continue  # the per-call fallback is ~100x slower: fewer samples
            samples[key].append(timed(fn))
    return {key: statistics.median(times) * 1e3 for key, times in samples.items()}


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines()
        model = next(x.split(":", 1)[1].strip() for x in lines if x.startswith("Model name"))
    except (OSError, StopIteration):
        pass
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{model}, {os.cpu_count()} CPUs, torch {torch.__version__} ({capability})"


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def table(ms: dict, rows_list: list[int], threads_list: list[int], names: list[str]) -> str:
    head = "| M | threads | " + " | ".join(f"{n} ms/step" for n in names)
    head += (
        " | native ms/token | F.linear / native | native step / M=1 step | int8 step / M=1 step |"
    )
    lines = [head, "|" + "---|" * (len(names) + 6)]
    for threads in threads_list:
        for rows in rows_list:
            native = ms[(rows, threads, "native")]
            cells = [f"{ms[(rows, threads, n)]:.1f}" for n in names]
            ratio = ms[(rows, threads, "F.linear")] / native
            vs_one = native / ms[(rows_list[0], threads, "native")]
            int8_vs_one = ms[(rows, threads, "int8")] / ms[(rows_list[0], threads, "int8")]
            lines.append(
                f"| {rows} | {threads} | " + " | ".join(cells) + f" | {native / rows:.2f} | "
                f"{ratio:.2f}x | {vs_one:.2f}x | {int8_vs_one:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 5, 8, 16, 128])
    parser.add_argument("--threads", type=int, nargs="+", default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-fallback", action="store_true", help="skip the slow per-call path")
    args = parser.parse_args()
    threads = args.threads or sorted({1, min(2, os.cpu_count() or 1)})
    before = loadavg()
    ms = run(args.rows, threads, args.rounds, not args.no_fallback)
    names = ["native", "int8", "avx2", "F.linear", "engine"]
    names += [] if args.no_fallback else ["fallback"]
    print(f"command: `python {' '.join(sys.argv)}`  ")
    print(f"machine: {machine()}  ")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC  ")
    print(f"load average (1/5/15 min): before {before}, after {loadavg()}  ")
    print(f"median of {args.rounds} interleaved rounds (fallback: {max(1, args.rounds // 3)})\n")
    print(table(ms, args.rows, threads, names))


if __name__ == "__main__":
    main()
