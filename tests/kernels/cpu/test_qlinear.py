"""The native quantized linear against the gguf reference: exact effective weights, results
within float32 rounding of the exact product (and of the PyTorch fallback), on both the AVX2 and
the scalar path, for every format, few-row (fused) and many-row (panel) shapes, with a bias."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.cpu import QuantizedWeight, dequantize, fallback, qlinear
from tests.kernels.cpu.quant_cases import FORMATS, ISAS, Q, activations

ROW_COUNTS = (1, 2, 3, 5, 8, 16, 33)


def rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """|computed - exact| <= K * 2^-23 * sum_k |x_k w_k| for any float32 summation order."""
    return x.shape[1] * 2.0**-23 * (x.abs().double() @ weight.abs().double().T)


@pytest.fixture(autouse=True)
def needs_native(native):
    return native


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_dequantize_equals_gguf_bit_for_bit(quant_cases, qtype, isa):
    case = quant_cases[qtype]
    assert torch.equal(dequantize(case.weight, isa=isa), case.reference)
    assert torch.equal(fallback.dequantize(case.weight), case.reference)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_identity_rows_read_back_the_stored_weights(quant_cases, qtype, isa):
    """x = I gives y = W^T exactly: the linear map's effective weights are gguf's values.
    All rows at once takes the panel path; five at a time the fused one."""
    case = quant_cases[qtype]
    eye = torch.eye(case.weight.in_features)
    assert torch.equal(qlinear(eye, case.weight, isa=isa), case.reference.T)
    for rows in eye.split(5):
        start = int(rows.argmax(dim=1)[0])
        expected = case.reference.T[start : start + rows.shape[0]]
        assert torch.equal(qlinear(rows, case.weight, isa=isa), expected)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_matches_exact_product_and_fallback(quant_cases, qtype, num_rows, with_bias, isa):
    case = quant_cases[qtype]
    x = activations(num_rows, case.weight.in_features, seed=num_rows)
    bias = torch.randn(case.weight.out_features) if with_bias else None
    got = qlinear(x, case.weight, bias, isa=isa)
    exact = x.double() @ case.reference.double().T
    if bias is not None:
        exact += bias.double()
    bound = rounding_bound(x, case.reference) + (bias.abs().double() * 2.0**-23 if with_bias else 0)
    assert got.shape == (num_rows, case.weight.out_features) and got.dtype == torch.float32
    assert ((got.double() - exact).abs() <= bound).all()
    reference = fallback.qlinear(x, case.weight, bias)
    assert ((got.double() - reference.double()).abs() <= 2 * bound).all()


def test_accepts_strided_rows_and_writes_a_column_slice(quant_cases):
    """How fused projections run: x rows with a gap between them, output columns of a wider
    tensor; the columns around the slice are left alone."""
    case = quant_cases[Q.Q4_1]
    k, n = case.weight.in_features, case.weight.out_features
    wide = activations(5, k + 16)
    x = wide[:, 8 : 8 + k]
    out = torch.full((5, n + 10), float("nan"))
    qlinear(x, case.weight, out=out[:, 3 : 3 + n])
    assert torch.equal(out[:, 3 : 3 + n], qlinear(x.contiguous(), case.weight))
    assert out[:, :3].isnan().all() and out[:, 3 + n :].isnan().all()


def test_rejects_bad_shapes_and_formats(quant_cases):
    case = quant_cases[Q.Q8_0]
    with pytest.raises(RuntimeError, match="blocks rows have"):
        qlinear(torch.randn(2, 32), case.weight)  # wrong input width for these rows
    with pytest.raises(ValueError, match="not one of the native formats"):
        QuantizedWeight(int(Q.Q2_K), case.weight.data, case.weight.in_features)
    with pytest.raises(ValueError, match="not a multiple of its block"):
        QuantizedWeight(int(Q.Q8_0), case.weight.data, 100)
    with pytest.raises(RuntimeError, match="x must be float32"):
        qlinear(torch.randn(2, case.weight.in_features).double(), case.weight)


def test_fallback_is_f_linear_over_gguf_values(quant_cases):
    case = quant_cases[Q.Q6_K]
    x = activations(4, case.weight.in_features)
    assert torch.equal(fallback.qlinear(x, case.weight), F.linear(x, case.reference))
