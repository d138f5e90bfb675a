"""The PyTorch twin of the native kernels: same interface, the `gguf` package's dequantisation.

`dequantize(weight)` is the ground truth for effective weights; `qlinear` = F.linear over it.
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


def qlinear(
    x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, in_features] float32 -> [M, out_features] = x @ dequantize(weight)^T (+ bias)."""
    return F.linear(x, dequantize(weight), bias)
