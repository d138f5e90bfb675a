"""int8 activations on AVX-512 VNNI (csrc/int8_vnni.h): weights repacked into tiles of 16
columns; each product within float32 rounding of the exact product of the quantized rows and
gguf's weights, as the AVX2 int8 path is; a row bitwise the same in any batch and with 1 or 2
threads; packing refuses what it cannot pack. Skips on CPUs without AVX-512 VNNI."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import ACTIVATIONS, fallback, qlinear
from tests.kernels.cpu.quant_cases import Q, activations
from tests.kernels.cpu.test_int8_activations import ROW_COUNTS, int8_bound

VNNI_FORMATS = (Q.Q4_0, Q.Q4_1, Q.Q8_0)


@pytest.fixture(autouse=True)
def needs_vnni(native):
    if not native.cpu_has_vnni():
        pytest.skip("this CPU has no AVX-512 VNNI")


def first_tiles(case, rows: int = 32):
    """The case's first `rows` output rows (tiles need a multiple of 16)."""
    return case.weight.with_rows(case.weight.data[:rows]), case.reference[:rows]


def vnni_linear(native, x, weight, bias=None, packed=None):
    packed = (
        native.pack_vnni(weight.data, weight.qtype, weight.in_features)
        if packed is None
        else packed
    )
    out = torch.empty(x.shape[0], weight.out_features)
    native.qlinear_out(x, weight.data, weight.qtype, bias, out, 0, ACTIVATIONS["int8"], packed)
    return out


@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("qtype", VNNI_FORMATS, ids=lambda q: q.name)
def test_matches_the_exact_product_of_the_quantized_rows(native, quant_cases, qtype, num_rows):
    weight, reference = first_tiles(quant_cases[qtype])
    x = activations(num_rows, weight.in_features, seed=num_rows)
    bias = torch.randn(weight.out_features)
    got = vnni_linear(native, x, weight, bias)
    values = fallback.int8_values(x)
    exact = values.double() @ reference.double().T + bias.double()
    bound = int8_bound(values, reference) + 1e-6
    assert ((got.double() - exact).abs() <= bound).all()
    avx2 = qlinear(x, weight, bias, isa="avx2", act="int8")
    assert ((got.double() - avx2.double()).abs() <= 2 * bound).all()


def test_extreme_weights_and_activations(native):
    """Q8_0 at +-127 against activations at +-127: the largest integer sums (and the q + 128
    offset trick) neither saturate nor overflow."""
    import gguf
    import numpy as np

    from kernels.cpu import QuantizedWeight

    rng = np.random.default_rng(5)
    values = rng.choice([-1.0, 1.0], size=(16, 256)).astype(np.float32)
    weight = QuantizedWeight(
        int(Q.Q8_0), torch.from_numpy(gguf.quants.quantize(values, Q.Q8_0)), 256
    )
    x = torch.from_numpy(rng.choice([-3.0, 3.0], size=(3, 256)).astype(np.float32))
    reference = fallback.dequantize(weight)
    values = fallback.int8_values(x)
    exact = values.double() @ reference.double().T
    error = (vnni_linear(native, x, weight).double() - exact).abs()
    assert (error <= int8_bound(values, reference)).all() and exact.abs().max() > 100


@pytest.mark.parametrize("qtype", VNNI_FORMATS, ids=lambda q: q.name)
def test_a_row_is_bitwise_the_same_in_any_batch(native, quant_cases, qtype):
    weight, _ = first_tiles(quant_cases[qtype])
    packed = native.pack_vnni(weight.data, weight.qtype, weight.in_features)
    batch = 21  # two chunks of eight rows and a remainder of five
    x = activations(batch, weight.in_features, seed=1)
    full = vnni_linear(native, x, weight, packed=packed)
    for num_rows in (1, 2, 3, 5, 8, 9, 16):
        for start in (0, 5, batch - num_rows):
            part = vnni_linear(native, x[start : start + num_rows], weight, packed=packed)
            assert torch.equal(part, full[start : start + num_rows]), (num_rows, start)


def test_thread_count_does_not_change_results(native, quant_cases):
    weight, _ = first_tiles(quant_cases[Q.Q4_1])
    x = activations(6, weight.in_features, seed=2)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(vnni_linear(native, x, weight))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_packing_refuses_what_it_cannot_pack(native, quant_cases):
    q5 = quant_cases[Q.Q5_0].weight
    with pytest.raises(RuntimeError, match="Q4_0, Q4_1 or Q8_0"):
        native.pack_vnni(q5.data[:16].contiguous(), q5.qtype, q5.in_features)
    odd = quant_cases[Q.Q4_0].weight  # 37 rows
    with pytest.raises(RuntimeError, match="multiple of 16"):
        native.pack_vnni(odd.data, odd.qtype, odd.in_features)
    weight, _ = first_tiles(quant_cases[Q.Q4_0])
    packed = native.pack_vnni(weight.data, weight.qtype, weight.in_features)
    x, out = activations(1, weight.in_features), torch.empty(1, weight.out_features)
    with pytest.raises(RuntimeError, match="act=1"):  # float32 activations never take it
        native.qlinear_out(x, weight.data, weight.qtype, None, out, 0, 0, packed)
