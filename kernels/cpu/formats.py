"""GGUF block formats the CPU kernels run as stored, and the weight type that carries them.

A `QuantizedWeight` is a linear layer's weight [out_features, in_features] kept as the GGUF's
blocks: `data` is uint8 [out_features, row_bytes], each row the blocks of one output row, in
file order. Row operations (selecting, permuting, concatenating rows) are plain byte-row
operations, because a block never spans two rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType
# Formats the native kernels read directly, bit-exact to gguf.quants.dequantize.
NATIVE_TYPES = frozenset({Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K})


def is_native_type(qtype: int) -> bool:
    return qtype in {int(t) for t in NATIVE_TYPES}


def row_bytes(qtype: int, in_features: int) -> int:
    """Bytes of one weight row of `in_features` values stored as `qtype` blocks."""
    block_elems, block_bytes = GGML_QUANT_SIZES[Q(qtype)]
    if in_features % block_elems:
        raise ValueError(
            f"{Q(qtype).name}: {in_features} inputs is not a multiple of its block ({block_elems})"
        )
    return in_features // block_elems * block_bytes


@dataclass(frozen=True)
class QuantizedWeight:
    qtype: int  # gguf.GGMLQuantizationType value, one of NATIVE_TYPES
    data: torch.Tensor  # uint8 [out_features, row_bytes], contiguous, on the CPU
    in_features: int

    def __post_init__(self) -> None:
        if not is_native_type(self.qtype):
            names = sorted(t.name for t in NATIVE_TYPES)
            raise ValueError(f"GGUF type {self.qtype} is not one of the native formats {names}")
        expected = row_bytes(self.qtype, self.in_features)
        if self.data.dtype != torch.uint8 or self.data.dim() != 2:
            raise ValueError(f"data must be uint8 [rows, {expected}], got {self.data.dtype}")
        if self.data.shape[1] != expected or not self.data.is_contiguous():
            raise ValueError(
                f"data rows must be contiguous with {expected} bytes, got {tuple(self.data.shape)}"
            )

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def type_name(self) -> str:
        return Q(self.qtype).name

    def with_rows(self, data: torch.Tensor) -> QuantizedWeight:
        """The same format with other rows (e.g. this weight's rows permuted)."""
        return QuantizedWeight(self.qtype, data.contiguous(), self.in_features)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Stack weights of one format and width along the output dimension."""
    first = parts[0]
    if any((p.qtype, p.in_features) != (first.qtype, first.in_features) for p in parts):
        raise ValueError("concat_rows needs parts of one format and one input width")
    return first.with_rows(torch.cat([p.data for p in parts]))
