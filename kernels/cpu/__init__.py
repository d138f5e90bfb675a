"""CPU linear layers that run a GGUF's quantized blocks as stored.

`qlinear(x, weight, bias)` computes x [M, K] @ W^T (+ bias) -> [M, N] float32, where `weight`
is a QuantizedWeight (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K blocks). Contract of the native path:
  * effective weights equal gguf.quants.dequantize bit for bit; float32 activations and sums;
  * batch invariance: each output row depends on its own input row only, with one reduction
    order for every M and every thread count, so a row is bitwise the same alone or in a batch;
  * verify-shaped: each block is read from memory once per call, whatever M is;
  * on CPUs with AVX-512 and VNNI, `pack_tiles` repacks Q4_0/Q4_1/Q8_0 weights into tiles of
    16 rows that qlinear_out(..., packed=...) runs for either activation mode.
act="int8" quantizes each activation row per group of 32 to int8 (its own scales, so batch
invariance holds) and runs exact integer dot products per group, llama.cpp's arithmetic; the
results differ from float32 activations by that quantization (fallback.quantize_rows).
`fallback` is the pure-PyTorch twin (dequantise with `gguf`, then F.linear); it is used when the
native library cannot be built (build.py logs one line saying why).
"""

from __future__ import annotations

import torch

from kernels.cpu import fallback
from kernels.cpu.build import load_native
from kernels.cpu.formats import NATIVE_TYPES, QuantizedWeight, concat_rows, is_native_type

__all__ = [
    "ACTIVATIONS",
    "NATIVE_TYPES",
    "QuantizedWeight",
    "concat_rows",
    "dequantize",
    "fast_path_available",
    "is_native_type",
    "load_native",
    "native_available",
    "pack_tiles",
    "qlinear",
]

# Instruction-set choice passed to the native ops: auto picks AVX2 when the CPU has it.
ISA = {"auto": 0, "scalar": 1, "avx2": 2}
# Activation arithmetic: float32, or int8 per row and group of 32.
ACTIVATIONS = {"float32": 0, "int8": 1}


def native_available() -> bool:
    return load_native() is not None


def fast_path_available() -> bool:
    """The native library loaded and this CPU runs its AVX2 + FMA + F16C path."""
    ops = load_native()
    return ops is not None and ops.cpu_has_avx2()


def qlinear(
    x: torch.Tensor,
    weight: QuantizedWeight,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    isa: str = "auto",
    act: str = "float32",
) -> torch.Tensor:
    """x [M, in_features] float32 -> [M, out_features]; `out` may be a column slice of a wider
    output (rows need not be contiguous with each other, elements of a row must be)."""
    ops = load_native()
    if ops is None:
        result = fallback.qlinear(x, weight, bias, act)
        return result if out is None else out.copy_(result)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
    ops.qlinear_out(x, weight.data, weight.qtype, bias, out, ISA[isa], ACTIVATIONS[act])
    return out


# Formats with AVX-512 paths over tiles of 16 weight rows (csrc/float_avx512.h for float32
# activations, csrc/int8_vnni.h for int8), and the tile width in rows.
TILE_TYPES = frozenset({2, 3, 8})  # Q4_0, Q4_1, Q8_0
TILE_ROWS = 16


def pack_tiles(weight: QuantizedWeight) -> torch.Tensor | None:
    """`weight` repacked into AVX-512 tiles of 16 rows (bytes moved only), or None where those
    paths do not apply (no native library, a CPU without AVX-512 F/BW/VL/DQ and VNNI, another
    format, rows not a multiple of 16). qlinear_out runs them for either activation mode."""
    ops = load_native()
    if (
        ops is None
        or not ops.cpu_has_avx512()
        or weight.qtype not in TILE_TYPES
        or weight.out_features % TILE_ROWS
    ):
        return None
    return ops.pack_tiles(weight.data, weight.qtype, weight.in_features)


def dequantize(weight: QuantizedWeight, isa: str = "auto") -> torch.Tensor:
    """float32 [out_features, in_features]: native when available, else the gguf reference."""
    ops = load_native()
    if ops is None:
        return fallback.dequantize(weight)
    return ops.dequantize(weight.data, weight.qtype, weight.in_features, ISA[isa])
