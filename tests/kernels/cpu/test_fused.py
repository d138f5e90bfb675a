"""The fused decode-step ops (kernels/fused.py): native results against their PyTorch
twins on odd shapes, row independence (a row alone = the row in a batch, bitwise), the
residual update of add_rms_norm, and the PyTorch path taken where the native one must not run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import fused

pytestmark = pytest.mark.usefixtures("native")


def torch_rope(x, positions, cos, sin_signed):
    c, s = cos[positions, None], sin_signed[positions, None]
    return x * c + torch.roll(x, x.shape[-1] // 2, dims=-1) * s


def tables(positions: int, head_dim: int):
    angles = torch.outer(torch.arange(positions).float(), torch.rand(head_dim // 2) + 0.01)
    emb = torch.cat([angles, angles], dim=-1)
    sign = torch.cat([-torch.ones(head_dim // 2), torch.ones(head_dim // 2)])
    return emb.cos(), emb.sin() * sign


@pytest.mark.parametrize("rows, cols", [(1, 576), (5, 896), (33, 7)])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm_matches_torch(rows: int, cols: int, with_delta: bool) -> None:
    residual, weight = torch.randn(rows, cols) * 3, torch.randn(cols)
    delta = torch.randn(rows, cols) if with_delta else None
    expected_sum = residual + delta if with_delta else residual.clone()
    want = weight * F.rms_norm(expected_sum, (cols,), eps=1e-5)
    new_residual, got = fused.add_rms_norm(residual, delta, weight, 1e-5)
    assert torch.equal(new_residual, expected_sum)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("tokens, heads, head_dim", [(1, 12, 64), (7, 3, 128), (4, 2, 6)])
def test_rope_in_place_matches_torch(tokens: int, heads: int, head_dim: int) -> None:
    cos, sin_signed = tables(50, head_dim)
    positions = torch.randint(0, 50, (tokens,))
    wide = torch.randn(tokens, heads + 3, head_dim)  # rotate a strided slice, as the model does
    x = wide[:, :heads]
    want = torch_rope(x.clone(), positions, cos, sin_signed)
    untouched = wide[:, heads:].clone()
    assert fused.rope_(x, positions, cos, sin_signed) is x
    torch.testing.assert_close(x, want, atol=1e-6, rtol=1e-6)
    assert torch.equal(wide[:, heads:], untouched)


def test_rope_refuses_positions_past_the_table() -> None:
    cos, sin_signed = tables(8, 4)
    with pytest.raises(RuntimeError, match="out of range"):
        fused.rope_(torch.randn(1, 1, 4), torch.tensor([8]), cos, sin_signed)


@pytest.mark.parametrize("rows, cols", [(1, 1536), (6, 13)])
def test_silu_mul_matches_torch(rows: int, cols: int) -> None:
    gate_up = torch.randn(rows, 2 * cols) * 4
    want = F.silu(gate_up[:, :cols]) * gate_up[:, cols:]
    torch.testing.assert_close(fused.silu_mul(gate_up), want, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("rows, cols", [(1, 2048), (6, 13)])
def test_gelu_tanh_mul_matches_torch(rows: int, cols: int) -> None:
    """Gemma's GeGLU: the AVX2 path (cols % 8 == 0) and the scalar one, over large |gate| too.
    Against float64: PyTorch's float32 0.5 g (1 + tanh) loses ~1e-7 absolute to cancellation
    where g < 0; ours (g sigmoid(2y)) stays within float32 rounding of the exact value."""
    gate_up = torch.randn(rows, 2 * cols) * 4
    gate_up[0, :4] = torch.tensor([-30.0, 30.0, 0.0, -1e-4])
    exact = gate_up.double()
    want = F.gelu(exact[:, :cols], approximate="tanh") * exact[:, cols:]
    got = fused.gelu_tanh_mul(gate_up).double()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    row = gate_up[-1:]
    assert torch.equal(fused.gelu_tanh_mul(row), fused.gelu_tanh_mul(gate_up)[-1:])


def test_rows_are_bitwise_the_same_alone_and_in_a_batch() -> None:
    batch, weight = torch.randn(9, 576), torch.randn(576)
    cos, sin_signed = tables(64, 64)
    positions = torch.arange(9) * 3
    _, normed = fused.add_rms_norm(batch.clone(), None, weight, 1e-5)
    activated = fused.silu_mul(batch)
    rotated = fused.rope_(batch.clone().view(9, 9, 64), positions, cos, sin_signed)
    for i in range(9):
        row = batch[i : i + 1]
        assert torch.equal(
            fused.add_rms_norm(row.clone(), None, weight, 1e-5)[1], normed[i : i + 1]
        )
        assert torch.equal(fused.silu_mul(row), activated[i : i + 1])
        one = fused.rope_(row.clone().view(1, 9, 64), positions[i : i + 1], cos, sin_signed)
        assert torch.equal(one, rotated[i : i + 1])


def test_autograd_and_other_dtypes_take_the_torch_path() -> None:
    weight = torch.randn(16)
    x = torch.randn(2, 16, requires_grad=True)
    _, normed = fused.add_rms_norm(x, None, weight, 1e-5)
    assert normed.requires_grad  # the native op would have cut the graph
    half = torch.randn(2, 32).bfloat16()
    want = F.silu(half[:, :16]) * half[:, 16:]
    assert torch.equal(fused.silu_mul(half), want)
