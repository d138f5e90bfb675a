"""The PyTorch twin of the native kernels: same interface, the `gguf` package's dequantisation.

`dequantize(weight)` is the ground truth for effective weights; `qlinear` = F.linear over it.
`quantize_rows(x)` is the int8-activation path's quantization (per row and group of 32), the
values the native kernels compute with when act="int8".
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


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x float32 [M, K] -> (q int8 [M, K], d float32 [M, K / 32]): per group of 32 inputs of a
    row, d = amax / 127 and q = round-half-even(x * (1 / d)) (0 for an all-zero group)."""
    groups = x.reshape(x.shape[0], -1, 32)
    d = groups.abs().amax(dim=-1) / 127.0
    inverse = torch.where(d != 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(groups * inverse.unsqueeze(-1)).to(torch.int8)
    return q.reshape(x.shape), d


def int8_values(x: torch.Tensor) -> torch.Tensor:
    """The activations the int8 path computes with, as float32: d * q per group."""
    q, d = quantize_rows(x)
    return (q.reshape(x.shape[0], -1, 32).float() * d.unsqueeze(-1)).reshape(x.shape)


def qlinear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None, act: str = "float32"
) -> torch.Tensor:
    """x [M, in_features] float32 -> [M, out_features] = x @ dequantize(weight)^T (+ bias);
    act="int8": x first takes the int8-activation path's values (int8_values)."""
    if act == "int8":
        x = int8_values(x.float())
    return F.linear(x, dequantize(weight), bias)
