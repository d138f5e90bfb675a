"""Linear layers tuned for few-row float32 matmuls on CPU (decode, speculative verify).

Measured on the 2-core AMD EPYC dev machine (torch 2.13, MKL, one thread; SmolLM2's 30 layers
of weights, 424 MB): `F.linear(x, W)` with x [M, in] takes 38 ms at M=1, 66 ms at M=2 and
76 ms at M=3, while the same product written as `(W @ x.T).T` takes 26, 25 and 39 ms; from
M=8 on F.linear is faster again. MKL's x @ W^T path for a handful of rows is far from
memory-bound; W @ x^T streams W once. A single row is duplicated because the matrix-vector
path is the slow one. GPUs and other dtypes keep F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Largest row count that takes the W @ x^T path (crossover measured between 4 and 8).
MAX_ROWS_TRANSPOSED = 5


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same result as F.linear(x, weight, bias) for x [M, in], weight [out, in]."""
    num_rows = x.shape[0]
    if (
        x.device.type != "cpu"
        or x.dtype != torch.float32
        or x.dim() != 2
        or num_rows > MAX_ROWS_TRANSPOSED
    ):
        return F.linear(x, weight, bias)
    padded = torch.cat((x, x)) if num_rows == 1 else x
    out = (weight @ padded.T).T[:num_rows].contiguous()
    return out if bias is None else out + bias


class Linear(nn.Linear):
    """nn.Linear (same parameters and state-dict names) computed with `linear` above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
