"""The AVX-512 paths over weights repacked into tiles of 16 columns (kernels/cpu pack_tiles):
float32 activations (csrc/float_avx512.h) with gguf's exact effective weights and results within
float32 rounding of the exact product; int8 activations (csrc/int8_vnni.h) within rounding of
the exact product of the quantized rows, as the AVX2 int8 path is; in both, a row bitwise the
same in any batch and with 1 or 2 threads; packing refuses what it cannot pack. Skips on CPUs
without AVX-512 (F, BW, VL, DQ) and VNNI."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import ACTIVATIONS, fallback, qlinear
from tests.kernels.cpu.quant_cases import Q, activations, with_thread_counts
from tests.kernels.cpu.test_int8_activations import ROW_COUNTS, int8_bound
from tests.kernels.cpu.test_qlinear import rounding_bound

TILE_FORMATS = (Q.Q4_0, Q.Q4_1, Q.Q8_0)
MODES = ("float32", "int8")


@pytest.fixture(autouse=True)
def needs_vnni(native):
    if not native.cpu_has_avx512():
        pytest.skip("this CPU lacks AVX-512 (F, BW, VL, DQ) or VNNI")


def first_tiles(case, rows: int = 32):
    """The case's first `rows` output rows (tiles need a multiple of 16)."""
    return case.weight.with_rows(case.weight.data[:rows]), case.reference[:rows]


def product_case(case, num_rows: int):
    """(weight, reference, x [num_rows, K], bias) over the case's first two tiles."""
    weight, reference = first_tiles(case)
    x = activations(num_rows, weight.in_features, seed=num_rows)
    return weight, reference, x, torch.randn(weight.out_features)


def tile_linear(native, x, weight, bias=None, packed=None, act="int8"):
    if packed is None:
        packed = native.pack_tiles(weight.data, weight.qtype, weight.in_features)
    out = torch.empty(x.shape[0], weight.out_features)
    native.qlinear_out(x, weight.data, weight.qtype, bias, out, 0, ACTIVATIONS[act], packed)
    return out


@pytest.mark.parametrize("qtype", TILE_FORMATS, ids=lambda q: q.name)
def test_float_identity_rows_read_back_the_stored_weights(native, quant_cases, qtype):
    """x = I gives y = W^T exactly: the effective weights are gguf's values, all rows at once
    (chunks of four) and five at a time."""
    weight, reference = first_tiles(quant_cases[qtype])
    eye = torch.eye(weight.in_features)
    assert torch.equal(tile_linear(native, eye, weight, act="float32"), reference.T)
    for rows in eye.split(5):
        start = int(rows.argmax(dim=1)[0])
        got = tile_linear(native, rows, weight, act="float32")
        assert torch.equal(got, reference.T[start : start + rows.shape[0]])


@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("qtype", TILE_FORMATS, ids=lambda q: q.name)
def test_float_matches_the_exact_product(native, quant_cases, qtype, num_rows):
    weight, reference, x, bias = product_case(quant_cases[qtype], num_rows)
    got = tile_linear(native, x, weight, bias, act="float32")
    exact = x.double() @ reference.double().T + bias.double()
    bound = rounding_bound(x, reference) + bias.abs().double() * 2.0**-23
    assert ((got.double() - exact).abs() <= bound).all()
    assert not torch.equal(got, tile_linear(native, x, weight, bias, act="int8"))


@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("qtype", TILE_FORMATS, ids=lambda q: q.name)
def test_matches_the_exact_product_of_the_quantized_rows(native, quant_cases, qtype, num_rows):
    weight, reference, x, bias = product_case(quant_cases[qtype], num_rows)
    got = tile_linear(native, x, weight, bias)
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
    error = (tile_linear(native, x, weight).double() - exact).abs()
    assert (error <= int8_bound(values, reference)).all() and exact.abs().max() > 100


@pytest.mark.parametrize("act", MODES)
@pytest.mark.parametrize("qtype", TILE_FORMATS, ids=lambda q: q.name)
def test_a_row_is_bitwise_the_same_in_any_batch(native, quant_cases, qtype, act):
    weight, _ = first_tiles(quant_cases[qtype])
    packed = native.pack_tiles(weight.data, weight.qtype, weight.in_features)
    batch = 21  # two chunks of eight rows and a remainder of five
    x = activations(batch, weight.in_features, seed=1)
    full = tile_linear(native, x, weight, packed=packed, act=act)
    for num_rows in (1, 2, 3, 5, 8, 9, 16):
        for start in (0, 5, batch - num_rows):
            part = tile_linear(native, x[start : start + num_rows], weight, packed=packed, act=act)
            assert torch.equal(part, full[start : start + num_rows]), (num_rows, start)


@pytest.mark.parametrize("act", MODES)
def test_thread_count_does_not_change_results(native, quant_cases, act):
    weight, _ = first_tiles(quant_cases[Q.Q4_1])
    x = activations(6, weight.in_features, seed=2)
    one, two = with_thread_counts(lambda: tile_linear(native, x, weight, act=act))
    assert torch.equal(one, two)


def test_packing_refuses_what_it_cannot_pack(native, quant_cases):
    q5 = quant_cases[Q.Q5_0].weight
    with pytest.raises(RuntimeError, match="Q4_0, Q4_1 or Q8_0"):
        native.pack_tiles(q5.data[:16].contiguous(), q5.qtype, q5.in_features)
    odd = quant_cases[Q.Q4_0].weight  # 37 rows
    with pytest.raises(RuntimeError, match="multiple of 16"):
        native.pack_tiles(odd.data, odd.qtype, odd.in_features)
    weight, _ = first_tiles(quant_cases[Q.Q4_0])
    packed = native.pack_tiles(weight.data, weight.qtype, weight.in_features)
    x, out = activations(1, weight.in_features), torch.empty(1, weight.out_features)
    with pytest.raises(RuntimeError, match="isa=0"):  # an explicit ISA never takes the tiles
        native.qlinear_out(x, weight.data, weight.qtype, None, out, 2, 1, packed)
    with pytest.raises(RuntimeError, match="pack_tiles"):  # tiles of other weights
        native.qlinear_out(x, weight.data, weight.qtype, None, out, 0, 1, packed[:1])
