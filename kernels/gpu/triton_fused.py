"""The small ops of a decoder layer as one Triton kernel each, for CUDA tensors.

A bfloat16 decode step at batch 1 is a few hundred kernels, most of them elementwise (a
layer's two norms, RoPE and the gated activation were ~15 of its ~25 PyTorch kernels), and in
a replayed CUDA graph each costs ~2 µs whatever its size: fusing them is what shortens the step.

Each op computes what its PyTorch twin in kernels/fused.py computes, in the same order of
roundings (float32 arithmetic, rounded to the tensor's dtype where the twin rounds), so results
agree to one unit in the last place of the dtype (reductions are summed in another order).
Tests: tests/kernels/test_triton_fused.py (on a GPU, and on CPU tensors under Triton's
interpreter where Triton is installed).

`available()` says whether Triton imports; kernels compile at their first call per dtype and
shape class (seconds), so the runner's warm-up and graph capture pay it, not a request.
"""

from __future__ import annotations

import functools
import os

import torch

DISABLE_ENV = "GOODSPEED_TRITON"  # "0": use the PyTorch twins on CUDA too (A/B, debugging)


@functools.cache
def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def available() -> bool:
    return os.environ.get(DISABLE_ENV, "1") != "0" and _triton() is not None


def runs_on(x: torch.Tensor) -> bool:
    """Whether the Triton ops should run on x: CUDA (or CPU under the interpreter), no
    autograd, a floating dtype."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return (
        (x.is_cuda or interpreted)
        and not x.requires_grad
        and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and available()
    )


@functools.cache
def _kernels():
    triton, tl = _triton()

    @triton.jit
    def add_rms_norm_kernel(
        res_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr,
        cols, res_stride, delta_stride, eps,
        HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        offsets = tl.arange(0, BLOCK)
        mask = offsets < cols
        x = tl.load(res_ptr + row * res_stride + offsets, mask=mask, other=0.0)
        if HAS_DELTA:
            d = tl.load(delta_ptr + row * delta_stride + offsets, mask=mask, other=0.0)
            x = (x.to(tl.float32) + d.to(tl.float32)).to(x.dtype)  # the twin's sum, rounded
            tl.store(sum_ptr + row * cols + offsets, x, mask=mask)
        xf = x.to(tl.float32)
        inverse = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / cols + eps)
        normed = (xf * inverse).to(x.dtype)  # the twin normalises in float32, then rounds
        w = tl.load(weight_ptr + offsets, mask=mask, other=0.0)
        out = (normed.to(tl.float32) * w.to(tl.float32)).to(x.dtype)
        tl.store(out_ptr + row * cols + offsets, out, mask=mask)

    @triton.jit
    def rope_kernel(
        x_ptr, pos_ptr, cos_ptr, sin_ptr,
        heads, half, token_stride, head_stride, table_stride,
        ROUND_FIRST: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        token = tl.program_id(0).to(tl.int64)
        head = tl.program_id(1).to(tl.int64)
        offsets = tl.arange(0, BLOCK)
        mask = offsets < half
        position = tl.load(pos_ptr + token).to(tl.int64)
        base = x_ptr + token * token_stride + head * head_stride
        x1 = tl.load(base + offsets, mask=mask, other=0.0)
        x2 = tl.load(base + half + offsets, mask=mask, other=0.0)
        table = position * table_stride
        c1 = tl.load(cos_ptr + table + offsets, mask=mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + table + half + offsets, mask=mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + table + offsets, mask=mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + table + half + offsets, mask=mask, other=0.0).to(tl.float32)
        a, b = x1.to(tl.float32), x2.to(tl.float32)
        # rotate-half: out = x * cos + roll(x, D/2) * sin_signed (the sign lives in the table).
        # The twin rounds x * cos to the tables' type when x and the tables share a 16-bit one.
        ac, bc = a * c1, b * c2
        if ROUND_FIRST:
            ac, bc = ac.to(x1.dtype).to(tl.float32), bc.to(x1.dtype).to(tl.float32)
        tl.store(base + offsets, (ac + b * s1).to(x1.dtype), mask=mask)
        tl.store(base + half + offsets, (bc + a * s2).to(x1.dtype), mask=mask)

    @triton.jit
    def gated_kernel(
        gate_up_ptr, out_ptr, half, in_stride,
        GELU: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0).to(tl.int64)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < half
        g = tl.load(gate_up_ptr + row * in_stride + offsets, mask=mask, other=0.0)
        u = tl.load(gate_up_ptr + row * in_stride + half + offsets, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        # exp of minus a magnitude only, so nothing overflows
        if GELU:  # tanh approximation: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
            inner = 0.7978845608028654 * (gf + 0.044715 * gf * gf * gf)
            t = tl.exp(-2.0 * tl.abs(inner))
            tanh = (1.0 - t) / (1.0 + t)
            act = 0.5 * gf * (1.0 + tl.where(inner < 0, -tanh, tanh))
        else:  # g * sigmoid(g)
            t = tl.exp(-tl.abs(gf))
            act = gf * tl.where(gf >= 0, 1.0 / (1.0 + t), t / (1.0 + t))
        act = act.to(g.dtype)  # the twin's activation is a tensor of the input dtype
        out = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
        tl.store(out_ptr + row * half + offsets, out, mask=mask)

    return triton, add_rms_norm_kernel, rope_kernel, gated_kernel


def add_rms_norm(
    residual: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(residual + delta, weight * rms_norm(residual + delta)) for 2-D rows; new tensors."""
    triton, kernel, _, _ = _kernels()
    rows, cols = residual.shape
    if residual.stride(-1) != 1 or (delta is not None and delta.stride(-1) != 1):
        residual = residual.contiguous()
        delta = None if delta is None else delta.contiguous()
    total = torch.empty_like(residual) if delta is not None else residual
    out = torch.empty(rows, cols, dtype=residual.dtype, device=residual.device)
    block = triton.next_power_of_2(cols)
    if rows:
        kernel[(rows,)](
            residual, residual if delta is None else delta, weight.contiguous(), total, out,
            cols, residual.stride(0), 0 if delta is None else delta.stride(0), eps,
            HAS_DELTA=delta is not None, BLOCK=block, num_warps=min(8, max(1, block // 256)),
        )  # fmt: skip
    return total, out


def rope_(
    x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor
) -> torch.Tensor:
    """x [T, heads, D] rotated in place (rotate-half, tables [positions, D]); returns x."""
    triton, _, kernel, _ = _kernels()
    tokens, heads, head_dim = x.shape
    if tokens and heads:
        half = head_dim // 2
        cos, sin_signed = cos.contiguous(), sin_signed.contiguous()
        round_first = torch.promote_types(x.dtype, cos.dtype) != torch.float32
        kernel[(tokens, heads)](
            x, positions, cos, sin_signed,
            heads, half, x.stride(0), x.stride(1), cos.stride(0),
            ROUND_FIRST=round_first, BLOCK=triton.next_power_of_2(half),
        )  # fmt: skip
    return x


def gated(gate_up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """[T, 2I] = [gate | up] -> act(gate) * up [T, I] (silu, or gelu with the tanh form)."""
    triton, _, _, kernel = _kernels()
    gate_up = gate_up if gate_up.stride(-1) == 1 else gate_up.contiguous()
    rows, width = gate_up.shape
    half = width // 2
    out = torch.empty(rows, half, dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(half))
    if rows and half:
        kernel[(rows, triton.cdiv(half, block))](
            gate_up, out, half, gate_up.stride(0), GELU=gelu, BLOCK=block
        )
    return out
