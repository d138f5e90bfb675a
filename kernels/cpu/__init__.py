"""CPU linear layers that run a GGUF's quantized blocks as stored.

`qlinear(x, weight, bias)` computes x [M, K] @ W^T (+ bias) -> [M, N] float32, where `weight`
is a QuantizedWeight (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K blocks). Contract of the
native path, for every activation mode (`act`):
  * batch invariance: each output row depends on its own input row only, with one reduction
    order for every M and every thread count, so a row is bitwise the same alone or in a batch;
  * each weight block is read from memory once per call (per 64 rows past 64).
act="float32": effective weights equal gguf.quants.dequantize bit for bit, float32 sums.
act="int16" / "int8": each activation row is quantized per group of 32 to 16 / 8 bits (its own
scale), weights run as packed tiles (`pack_tiles`, csrc/tile_pack.h) with exact integer dot
products per group and one float order (csrc/qint_kernel.h): the same bytes on the AVX-512
(VNNI), AVX2 and scalar paths. The results differ from float32 activations by that quantization
(fallback.int_values); int16's step is 1/32639 of a group's largest value, int8's 1/127.
`fallback` is the pure-PyTorch twin (dequantise with `gguf`, then F.linear); it is used when the
native library cannot be built (build.py logs one line saying why).
"""

from __future__ import annotations

import torch

from kernels.cpu import fallback
from kernels.cpu.build import load_native
from kernels.cpu.formats import NATIVE_TYPES, QuantizedWeight, concat_rows, is_native_type
from kernels.cpu.huge_pages import empty_bytes

__all__ = [
    "ACTIVATIONS",
    "NATIVE_TYPES",
    "QuantizedWeight",
    "concat_rows",
    "dequantize",
    "fast_path_available",
    "float_tiles_run",
    "is_native_type",
    "load_native",
    "native_available",
    "pack_parts",
    "pack_runs",
    "pack_tiles",
    "qlinear",
    "set_linear_isa_cap",
]

# Instruction-set choice passed to the native ops: auto is the best the CPU has; the others cap it.
ISA = {"auto": 0, "scalar": 1, "avx2": 2, "avx512": 3}
# Activation arithmetic: float32, or int16 / int8 per row and group of 32.
ACTIVATIONS = {"float32": 0, "int8": 1, "int16": 2}


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
    packed: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, in_features] float32 -> [M, out_features]; `out` may be a column slice of a wider
    output (rows need not be contiguous with each other, elements of a row must be). `packed`:
    pack_tiles(weight), made here when an integer mode needs it and none is given."""
    ops = load_native()
    if ops is None:
        result = fallback.qlinear(x, weight, bias, act)
        return result if out is None else out.copy_(result)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
    if packed is None and act != "float32":
        packed = pack_tiles(weight)
    ops.qlinear_out(x, weight.data, weight.qtype, bias, out, ISA[isa], ACTIVATIONS[act], packed)
    return out


# Rows (weight columns) per tile of the packed layout; float32 activations run tiles of these
# formats on AVX-512 (csrc/float_avx512.h), the integer modes run every format's.
TILE_ROWS = 16
FLOAT_TILE_TYPES = frozenset({2, 3, 8})  # Q4_0, Q4_1, Q8_0


def set_linear_isa_cap(isa: int) -> None:
    """Cap the linear kernels' ISA for the whole process (ISA values; "auto" lifts the cap): the
    tests run a model on each path of one machine. No-op without the native library."""
    ops = load_native()
    if ops is not None:
        ops.set_linear_isa_cap(isa)


def pack_tiles(weight: QuantizedWeight) -> torch.Tensor | None:
    """`weight` repacked into tiles of 16 rows (csrc/tile_pack.h; a last partial tile is padded),
    or None without the native library."""
    ops = load_native()
    if ops is None:
        return None
    return ops.pack_tiles(weight.data, weight.qtype, weight.in_features)


def pack_parts(parts: list[QuantizedWeight]) -> torch.Tensor | None:
    """pack_tiles of the parts' rows stacked (one format and width; every part but the last
    fills whole tiles), each part packed straight into its rows of one tensor: no copy of the
    blocks or the tiles is made. None without the native library."""
    packed = pack_runs([parts])
    return None if packed is None else packed[0]


def pack_runs(runs: list[list[QuantizedWeight]]) -> list[torch.Tensor] | None:
    """pack_parts of every run, in one native call: a model's weights packed with the GIL
    released once (a call per tensor waited for the GIL behind the tokenizer's loading
    thread each time). None without the native library."""
    ops = load_native()
    if ops is None:
        return None
    packed, blocks, formats, widths, outs = [], [], [], [], []
    shapes = [_tiles_shape(ops, parts) for parts in runs]
    arena = empty_bytes(sum(_aligned(sum(counts) * width) for counts, width in shapes))
    offset = 0
    for parts, (counts, width) in zip(runs, shapes, strict=True):
        rows = sum(counts)
        tiles = arena[offset : offset + rows * width].view(rows, width)
        offset += _aligned(rows * width)
        packed.append(tiles)
        for part, part_tiles in zip(parts, tiles.split(counts), strict=True):
            blocks.append(part.data)
            formats.append(part.qtype)
            widths.append(part.in_features)
            outs.append(part_tiles)
    ops.pack_tiles_into(blocks, formats, widths, outs)
    return packed


def _tiles_shape(ops, parts: list[QuantizedWeight]) -> tuple[list[int], int]:
    """(tiles of each part, bytes per tile) of a run's parts packed into one tensor."""
    first = parts[0]
    if any((p.qtype, p.in_features) != (first.qtype, first.in_features) for p in parts) or any(
        p.out_features % TILE_ROWS for p in parts[:-1]
    ):
        raise ValueError("pack_parts needs parts of one format and width, whole tiles but the last")
    counts = [-(-part.out_features // TILE_ROWS) for part in parts]
    return counts, ops.tile_bytes(first.qtype, first.in_features)


def _aligned(nbytes: int) -> int:
    """Each run's tiles start on a page of their own in the arena."""
    return -(-nbytes // 4096) * 4096


def float_tiles_run(weight: QuantizedWeight, out_features: int | None = None) -> bool:
    """Whether float32 activations run this weight's tiles (else its blocks as stored);
    `out_features`: of the whole run the weight starts, when it is one part of it."""
    ops = load_native()
    rows = weight.out_features if out_features is None else out_features
    return (
        ops is not None
        and ops.linear_isa() == ISA["avx512"]  # after any set_linear_isa_cap
        and weight.qtype in FLOAT_TILE_TYPES
        and rows % TILE_ROWS == 0
    )


def dequantize(weight: QuantizedWeight, isa: str = "auto") -> torch.Tensor:
    """float32 [out_features, in_features]: native when available, else the gguf reference."""
    ops = load_native()
    if ops is None:
        return fallback.dequantize(weight)
    return ops.dequantize(weight.data, weight.qtype, weight.in_features, ISA[isa])
