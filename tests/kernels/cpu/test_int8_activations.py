"""The int8-activation path (act="int8"): activations quantized per row and group of 32 exactly
as fallback.quantize_rows does, products within float32 rounding of the exact product of those
values and the gguf weights, for every format, on the AVX2 and the scalar path; a row bitwise
the same alone or in any batch, with 1 or 2 threads."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import ISA, fallback, load_native, qlinear
from tests.kernels.cpu.quant_cases import FORMATS, ISAS, activations, with_thread_counts

ROW_COUNTS = (1, 2, 3, 4, 5, 8, 16, 33)


@pytest.fixture(autouse=True)
def needs_native(native):
    return native


def int8_bound(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rounding allowance: K * 2^-21 * sum_k |v_k| * m_k, m_k eight times the largest |w| of
    k's group (covers the formats' scale and offset terms, rounded apart)."""
    groups = weight.abs().reshape(weight.shape[0], -1, 32).amax(dim=-1)
    magnitude = 8 * groups.repeat_interleave(32, dim=1)
    return values.shape[1] * 2.0**-21 * (values.abs().double() @ magnitude.double().T)


@pytest.mark.parametrize("isa", ISAS)
def test_native_quantization_equals_the_reference(isa):
    x = activations(9, 256, seed=3)
    x[2, :32] = 0.0  # an all-zero group: d = 0, q = 0
    x[4, 40] = 1e30  # one huge value: the rest of its group rounds to 0
    x[5, 64:96] = torch.arange(32) - 15.5  # a ramp over the whole range
    q, d = load_native().quantize_rows(x, ISA[isa])
    q_ref, d_ref = fallback.quantize_rows(x)
    assert torch.equal(d, d_ref) and torch.equal(q, q_ref)
    assert q.abs().max() == 127 and (q[2, :32] == 0).all() and d[2, 0] == 0


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_matches_the_exact_product_of_the_quantized_rows(quant_cases, qtype, num_rows, isa):
    case = quant_cases[qtype]
    x = activations(num_rows, case.weight.in_features, seed=num_rows)
    bias = torch.randn(case.weight.out_features)
    got = qlinear(x, case.weight, bias, isa=isa, act="int8")
    values = fallback.int8_values(x)
    exact = values.double() @ case.reference.double().T + bias.double()
    bound = int8_bound(values, case.reference) + 1e-6
    assert ((got.double() - exact).abs() <= bound).all()
    # The quantization is visible: not the float32-activation result.
    assert not torch.equal(got, qlinear(x, case.weight, bias, isa=isa))
    fallback_result = fallback.qlinear(x, case.weight, bias, act="int8")
    assert ((got.double() - fallback_result.double()).abs() <= 2 * bound).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_a_row_is_bitwise_the_same_in_any_batch(quant_cases, qtype, isa):
    weight = quant_cases[qtype].weight
    batch = 23  # five 4-row tiles and a remainder of 3
    x = activations(batch, weight.in_features, seed=1)
    full = qlinear(x, weight, isa=isa, act="int8")
    for num_rows in (1, 2, 3, 4, 5, 6, 9, 16):
        for start in (0, 5, batch - num_rows):
            part = qlinear(x[start : start + num_rows], weight, isa=isa, act="int8")
            assert torch.equal(part, full[start : start + num_rows]), (num_rows, start)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_thread_count_does_not_change_results(quant_cases, qtype):
    weight = quant_cases[qtype].weight
    x = activations(6, weight.in_features, seed=2)
    one, two = with_thread_counts(lambda: qlinear(x, weight, act="int8"))
    assert torch.equal(one, two)


def test_rejects_an_unknown_activation_mode(quant_cases):
    weight = quant_cases[FORMATS[0]].weight
    x = activations(1, weight.in_features)
    out = torch.empty(1, weight.out_features)
    with pytest.raises(RuntimeError, match="act must be"):
        load_native().qlinear_out(x, weight.data, weight.qtype, None, out, 0, 7)
