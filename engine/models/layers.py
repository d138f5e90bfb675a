"""The small layers of a Llama-family decoder: RMSNorm (with the residual add), RoPE.

Numerics follow transformers' Llama: RMSNorm in float32, RoPE in the rotate-half convention
with cos/sin computed in float32. The arithmetic is in kernels/fused.py: native fused ops
on CPU float32, Triton kernels on CUDA, PyTorch elsewhere (other dtypes, no compiler).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.arch_config import ModelArchConfig
from kernels.fused import add_rms_norm, rope_


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, residual: torch.Tensor, delta: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + delta, the norm of it): the decoder's residual add folded into its norm.
        The residual may be updated in place."""
        return add_rms_norm(residual, delta, self.weight, self.eps)


class Rotary(nn.Module):
    """cos/sin tables [max_positions, head_dim], computed once, indexed by position.

    rotate_half(x) = cat(-x2, x1) = roll(x, D/2) * sign with sign = (-1,..,-1, 1,..,1), so the
    sign is folded into `sin_signed` and RoPE costs one roll, two multiplies and an add.
    """

    def __init__(self, config: ModelArchConfig, local: bool = False) -> None:
        super().__init__()
        self.config = config
        self.local = local  # the sliding layers' table (ModelArchConfig.local_rope_theta)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin_signed", torch.empty(0), persistent=False)
        self.reset()

    def reset(self, freq_factors: torch.Tensor | None = None) -> None:
        """(Re)build the tables; `freq_factors` [head_dim // 2] divide the frequencies (GGUF)."""
        inv_freq = self.config.inv_freq(self.local)
        if freq_factors is not None and not self.local:
            inv_freq = inv_freq / freq_factors.float().cpu()
        cpu = torch.device("cpu")
        positions = torch.arange(
            self.config.max_position_embeddings, dtype=torch.float32, device=cpu
        )
        freqs = torch.outer(positions, inv_freq)
        half = freqs.shape[-1]
        sign = torch.cat([-torch.ones(half, device=cpu), torch.ones(half, device=cpu)])
        emb = torch.cat([freqs, freqs], dim=-1)
        # Tables are computed on the CPU (explicit devices, so this also works inside a
        # `torch.device("meta")` block, where the loader calls reset() again after to_empty()).
        device, dtype = self.cos.device, self.cos.dtype
        self.cos = emb.cos().to(device=device, dtype=dtype)
        self.sin_signed = (emb.sin() * sign).to(device=device, dtype=dtype)

    def rotate_(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, D] rotated in place for positions [T] (< max_position_embeddings)."""
        return rope_(x, positions, self.cos, self.sin_signed)
