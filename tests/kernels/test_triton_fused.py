"""The Triton twins of a decoder layer's small ops (kernels/gpu/triton_fused.py) against the
PyTorch ops they replace (kernels/fused.py), in float32 and bfloat16, on odd shapes and
strided inputs: on a GPU, or on CPU tensors under Triton's interpreter where Triton is
installed without one (skipped where it is not, as on CI)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from kernels import fused
from kernels.gpu import triton_fused

if torch.cuda.is_available():
    DEVICE = "cuda"
elif importlib.util.find_spec("triton") is not None:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first built
    DEVICE = "cpu"
else:
    pytest.skip("Triton is not installed", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16]


def close(got: torch.Tensor, want: torch.Tensor, bitwise: float = 0.97) -> None:
    """Equal to one unit in the last place of the dtype (float32 sums in another order), and
    in bfloat16 mostly bitwise. The interpreter truncates float32 -> bfloat16 where compiled
    code rounds to nearest (its own limitation), so there a few units (they compound) and no bitwise count."""
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype == torch.bfloat16:
        ulps = 4 if DEVICE == "cpu" else 1
        torch.testing.assert_close(got.float(), want.float(), atol=1e-2, rtol=ulps * 2**-7)
        exact = (got == want).float().mean().item()
        assert DEVICE == "cpu" or exact > bitwise, f"{exact:.3f} of bfloat16 values bitwise equal"
    else:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 576), (5, 896), (3, 7)])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm(dtype, rows: int, cols: int, with_delta: bool) -> None:
    make = dict(device=DEVICE, dtype=dtype)
    residual, weight = torch.randn(rows, cols, **make) * 3, torch.randn(cols, **make)
    delta = torch.randn(rows, cols, **make) if with_delta else None
    before = residual.clone()
    want_sum, want = fused._add_rms_norm_torch(residual, delta, weight, 1e-5)
    got_sum, got = triton_fused.add_rms_norm(residual, delta, weight, 1e-5)
    if DEVICE == "cpu":
        close(got_sum, want_sum)
    else:
        assert torch.equal(got_sum, want_sum)  # the same rounded sum
    assert torch.equal(residual, before)  # the caller's residual is left alone
    close(got, want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("table_dtype", [torch.float32, None])  # None: the model's dtype
@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 12, 64), (7, 3, 128), (4, 2, 6)])
def test_rope_in_place(dtype, table_dtype, tokens: int, heads: int, head_dim: int) -> None:
    angles = torch.outer(torch.arange(50).float(), torch.rand(head_dim // 2) + 0.01)
    emb = torch.cat([angles, angles], dim=-1)
    sign = torch.cat([-torch.ones(head_dim // 2), torch.ones(head_dim // 2)])
    tables = dict(device=DEVICE, dtype=table_dtype or dtype)
    cos, sin_signed = emb.cos().to(**tables), (emb.sin() * sign).to(**tables)
    positions = torch.randint(0, 50, (tokens,), device=DEVICE)
    # a strided slice of a wider row, as the model rotates Q and K inside the fused QKV output
    wide = torch.randn(tokens, heads + 3, head_dim, device=DEVICE, dtype=dtype)
    untouched = wide[:, heads:].clone()
    want = fused._rope_torch_(wide[:, :heads].clone(), positions, cos, sin_signed)
    x = wide[:, :heads]
    assert triton_fused.rope_(x, positions, cos, sin_signed) is x
    close(x, want)
    assert torch.equal(wide[:, heads:], untouched)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 1536), (6, 13), (2, 4100)])
@pytest.mark.parametrize("gelu", [False, True])
def test_gated_activation(dtype, rows: int, cols: int, gelu: bool) -> None:
    gate_up = torch.randn(rows, 2 * cols, device=DEVICE, dtype=dtype) * 4
    # GeLU's tanh is ours, not the CUDA library's: on the H200 96% of values were bitwise equal
    close(
        triton_fused.gated(gate_up, gelu), fused._gated_torch(gate_up, gelu), 0.93 if gelu else 0.97
    )


def test_zero_rows_and_the_switch(monkeypatch) -> None:
    empty = torch.empty(0, 8, device=DEVICE)
    assert triton_fused.gated(torch.empty(0, 16, device=DEVICE), False).shape == (0, 8)
    assert triton_fused.add_rms_norm(empty, None, torch.ones(8, device=DEVICE), 1e-5)[1].shape == (
        0,
        8,
    )
    x = torch.randn(2, 8, device=DEVICE)
    assert triton_fused.runs_on(x)
    monkeypatch.setenv(triton_fused.DISABLE_ENV, "0")
    assert not triton_fused.runs_on(x)
