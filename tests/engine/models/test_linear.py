"""The few-row CPU matmul path computes what F.linear computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.linear import MAX_ROWS_TRANSPOSED, Linear, linear


@pytest.mark.parametrize("num_rows", [1, 2, 3, MAX_ROWS_TRANSPOSED, MAX_ROWS_TRANSPOSED + 1, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_equals_f_linear(num_rows, with_bias):
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(48, 32, generator=gen)
    bias = torch.randn(48, generator=gen) if with_bias else None
    x = torch.randn(num_rows, 32, generator=gen)
    out = linear(x, weight, bias)
    assert out.shape == (num_rows, 48) and out.is_contiguous()
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)


def test_linear_accepts_strided_rows():
    x = torch.randn(3, 64)[:, ::2]  # non-contiguous columns
    weight = torch.randn(8, 32)
    torch.testing.assert_close(linear(x, weight), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_linear_module_keeps_nn_linear_state_dict_names():
    module = Linear(4, 3, bias=True)
    assert set(module.state_dict()) == {"weight", "bias"}
    x = torch.randn(2, 4)
    torch.testing.assert_close(module(x), F.linear(x, module.weight, module.bias))


def test_other_dtypes_take_f_linear():
    x, weight = torch.randn(2, 16, dtype=torch.bfloat16), torch.randn(4, 16, dtype=torch.bfloat16)
    assert torch.equal(linear(x, weight), F.linear(x, weight))
