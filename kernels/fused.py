"""The small ops of a decoder layer, fused: native on CPU float32, Triton on CUDA
(kernels/gpu/triton_fused.py, where Triton imports), PyTorch everywhere else.

`add_rms_norm(residual, delta, weight, eps)` -> (residual + delta, RMSNorm of it);
`rope_(x, positions, cos, sin_signed)` rotates x [T, heads, D] in place (rotate-half);
`silu_mul(gate_up)` -> silu(gate) * up; `gelu_tanh_mul(gate_up)` -> gelu_tanh(gate) * up (Gemma's
GeGLU). The native ops (csrc/decode_ops.cpp) run when the
extension is loaded and the tensors are CPU float32 without autograd; their results equal the
PyTorch twins' up to float rounding (tests/kernels/cpu/test_fused.py) and are batch
invariant. The native add_rms_norm updates `residual` in place; callers use the returned one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.cpu.build import load_native
from kernels.gpu import triton_fused


def native_ops(x: torch.Tensor):
    """The extension when it should run on `x`, else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.requires_grad:
        return None
    return load_native()


def _triton(x: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Whether the Triton twins run: CUDA tensors (all on one device), Triton importable."""
    if not x.is_cuda or not triton_fused.runs_on(x):
        return False
    return all(o is None or o.device == x.device for o in others)


def add_rms_norm(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + delta, weight * rms_norm(residual + delta)); delta None: no add."""
    ops = native_ops(residual)
    if ops is None or residual.dim() != 2 or weight.dtype != torch.float32:
        if residual.dim() == 2 and weight.dtype == residual.dtype and _triton(residual, delta):
            return triton_fused.add_rms_norm(residual, delta, weight, eps)
        return _add_rms_norm_torch(residual, delta, weight, eps)
    out = torch.empty_like(residual)
    ops.rms_norm_out(residual, delta, weight, eps, out)
    return residual, out


def _add_rms_norm_torch(residual, delta, weight, eps):
    if delta is not None:
        residual = residual + delta
    # Normalise in float32 and scale in the model dtype, as transformers does.
    normed = F.rms_norm(residual.float(), (residual.shape[-1],), eps=eps)
    return residual, weight * normed.to(residual.dtype)


def rope_(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor
) -> torch.Tensor:
    """x [T, heads, D] <- x * cos[pos] + roll(x, D/2) * sin_signed[pos]; returns x."""
    ops = native_ops(x)
    if ops is None or x.stride(-1) != 1 or cos.dtype != torch.float32:
        if x.stride(-1) == 1 and _triton(x, positions, cos, sin_signed):
            return triton_fused.rope_(x, positions, cos, sin_signed)
        return _rope_torch_(x, positions, cos, sin_signed)
    ops.rope_(x, positions.contiguous(), cos, sin_signed)
    return x


def _rope_torch_(x, positions, cos, sin_signed):
    c, s = cos[positions, None], sin_signed[positions, None]
    x.copy_(torch.addcmul(x * c, torch.roll(x, x.shape[-1] // 2, dims=-1), s))
    return x


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] = [gate | up] -> silu(gate) * up [T, I]."""
    return _gated(gate_up, gelu=False)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up [T, 2I] = [gate | up] -> gelu(gate, tanh approximation) * up [T, I]."""
    return _gated(gate_up, gelu=True)


def _gated(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    ops = native_ops(gate_up)
    if ops is None or gate_up.dim() != 2 or gate_up.stride(-1) != 1:
        if gate_up.dim() == 2 and _triton(gate_up):
            return triton_fused.gated(gate_up, gelu)
        return _gated_torch(gate_up, gelu)
    out = torch.empty(gate_up.shape[0], gate_up.shape[-1] // 2, dtype=torch.float32)
    (ops.gelu_tanh_mul_out if gelu else ops.silu_mul_out)(gate_up, out)
    return out


def _gated_torch(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    gate, up = gate_up.split(gate_up.shape[-1] // 2, dim=-1)
    return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up
