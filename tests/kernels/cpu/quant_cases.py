"""Quantized weights for the CPU kernel tests, written to a real GGUF file and read back.

Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 come from `gguf.quants.quantize` of random rows (one row scaled by 1e-4 so
its fp16 scales are subnormal); `gguf` cannot quantise K-quants, so those are random blocks
with finite fp16 scales (some subnormal). Shapes are odd: N = 37 output rows, K = 7 blocks of
32 or 3 super-blocks of 256.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch

from engine.models.gguf_file import read_gguf
from kernels.cpu import QuantizedWeight

Q = gguf.GGMLQuantizationType
FORMATS = (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K)
NUM_ROWS = 37
ISAS = ("avx2", "scalar")  # the native paths under test
# Where each format keeps its fp16 scales (byte offsets in a block).
_SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


@dataclass(frozen=True)
class Case:
    weight: QuantizedWeight
    reference: torch.Tensor  # float32 [N, K]: gguf.quants.dequantize of the same bytes


def in_features(qtype: Q) -> int:
    block_elems, _ = gguf.GGML_QUANT_SIZES[qtype]
    return 7 * block_elems if block_elems == 32 else 3 * block_elems


def k_quant_blocks(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows, cols // block_elems, block_bytes), dtype=np.uint8)
    scales = rng.uniform(1e-3, 2e-2, size=blocks.shape[:2])
    scales[0] = 3e-6  # below fp16's smallest normal (6.1e-5): subnormal scales
    for offset in _SCALE_OFFSETS[qtype]:
        halves = (scales * rng.choice([-1.0, 1.0], size=scales.shape)).astype(np.float16)
        blocks[..., offset : offset + 2] = halves.view(np.uint8).reshape(*scales.shape, 2)
    return blocks.reshape(rows, -1)


def quantized_rows(rng: np.random.Generator, qtype: Q, rows: int, cols: int) -> np.ndarray:
    if qtype in _SCALE_OFFSETS:
        return k_quant_blocks(rng, qtype, rows, cols)
    values = rng.standard_normal((rows, cols)).astype(np.float32)
    values[1] *= 1e-4
    return gguf.quants.quantize(values, qtype)


def write_and_read(path: Path, rng: np.random.Generator) -> dict[Q, Case]:
    writer = gguf.GGUFWriter(path, "llama")
    for qtype in FORMATS:
        data = quantized_rows(rng, qtype, NUM_ROWS, in_features(qtype))
        writer.add_tensor(f"w.{qtype.name}", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cases = {}
    for tensor in read_gguf(path).tensors:
        qtype = Q(tensor.ggml_type)
        data = torch.from_numpy(np.array(tensor.data))
        reference = gguf.quants.dequantize(np.array(tensor.data), qtype)
        cases[qtype] = Case(
            QuantizedWeight(int(qtype), data, in_features(qtype)),
            torch.from_numpy(reference.reshape(NUM_ROWS, -1).astype(np.float32)),
        )
    return cases


def activations(num_rows: int, width: int, seed: int = 0) -> torch.Tensor:
    """Rows of different magnitudes, so that no row is a scaled copy of the tolerance."""
    gen = torch.Generator().manual_seed(seed)
    scales = torch.logspace(-2, 1, num_rows).unsqueeze(1)
    return torch.randn(num_rows, width, generator=gen) * scales


def with_thread_counts(fn, counts: tuple[int, ...] = (1, 2)) -> list:
    """fn() run once at each intra-op thread count; the setting is restored after."""
    threads = torch.get_num_threads()
    try:
        results = []
        for count in counts:
            torch.set_num_threads(count)
            results.append(fn())
    finally:
        torch.set_num_threads(threads)
    return results
