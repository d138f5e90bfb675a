"""The PyTorch twin of the native kernels: same interface, the `gguf` package's dequantisation.

`dequantize(weight)` is the ground truth for effective weights; `qlinear` = F.linear over it.
`quantize_rows(x, levels)` is the integer-activation paths' quantization (per row and group of
32; levels 127 for act="int8", 32639 for act="int16"): `int_values` are the values the native
kernels compute with in those modes.
It is the reference in tests and the path taken when the native library cannot be built (the
model then loads float32 weights once instead of dequantising on every call).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from gguf.quants import dequantize as gguf_dequantize

from kernels.cpu.formats import QuantizedWeight


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """float32 [out_features, in_features], exactly gguf.quants.dequantize's values."""
    array = gguf_dequantize(weight.data.numpy(), weight.qtype)
    return torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32)).reshape(weight.shape)


# Largest |q| per activation mode (csrc/act_quant.h).
LEVELS = {"int8": 127, "int16": 32639}


def quantize_rows(x: torch.Tensor, levels: int = 127) -> tuple[torch.Tensor, torch.Tensor]:
    """x float32 [M, K] -> (q int32 [M, K], d float32 [M, K / 32]): per group of 32 inputs of a
    row, d = amax / levels and q = round-half-even(x * (1 / d)) (0 for an all-zero group)."""
    groups = x.reshape(x.shape[0], -1, 32)
    d = groups.abs().amax(dim=-1) / float(levels)
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(groups * inverse.unsqueeze(-1)).to(torch.int32)
    return q.reshape(x.shape), d


def int_values(x: torch.Tensor, act: str = "int8") -> torch.Tensor:
    """The activations an integer mode computes with, as float32: d * q per group."""
    q, d = quantize_rows(x, LEVELS[act])
    return (q.reshape(x.shape[0], -1, 32).float() * d.unsqueeze(-1)).reshape(x.shape)


def qlinear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None, act: str = "float32"
) -> torch.Tensor:
    """x [M, in_features] float32 -> [M, out_features] = x @ dequantize(weight)^T (+ bias);
    act "int8" / "int16": x first takes that mode's values (int_values)."""
    if act in LEVELS:
        x = int_values(x.float(), act)
    return F.linear(x, dequantize(weight), bias)
