"""The AVX-512 float32-activation path over weights packed into tiles of 16 columns (kernels/cpu
pack_tiles, csrc/float_avx512.h): gguf's exact effective weights, results within float32
rounding of the exact product, a row bitwise the same in any batch and with 1 or 2 threads; the
path runs only where asked (AVX-512, its three formats, whole tiles). The integer modes over the
same tiles are tests/kernels/cpu/test_int_activations.py. Skips on CPUs without AVX-512 (F, BW,
VL, DQ) and VNNI."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import ACTIVATIONS, float_tiles_run, qlinear
from tests.kernels.cpu.quant_cases import FORMATS, Q, activations, with_thread_counts
from tests.kernels.cpu.test_qlinear import rounding_bound

TILE_FORMATS = (Q.Q4_0, Q.Q4_1, Q.Q8_0)
ROW_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 33)


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


def tile_linear(native, x, weight, bias=None, packed=None, act="float32"):
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
    got = tile_linear(native, x, weight, bias)
    exact = x.double() @ reference.double().T + bias.double()
    bound = rounding_bound(x, reference) + bias.abs().double() * 2.0**-23
    assert ((got.double() - exact).abs() <= bound).all()
    # The tiles ran: the AVX2 path sums in another order.
    assert not torch.equal(got, qlinear(x, weight, bias, isa="avx2"))


@pytest.mark.parametrize("qtype", TILE_FORMATS, ids=lambda q: q.name)
def test_a_row_is_bitwise_the_same_in_any_batch(native, quant_cases, qtype):
    weight, _ = first_tiles(quant_cases[qtype])
    packed = native.pack_tiles(weight.data, weight.qtype, weight.in_features)
    batch = 21  # three chunks of six rows and a remainder of three
    x = activations(batch, weight.in_features, seed=1)
    full = tile_linear(native, x, weight, packed=packed)
    for num_rows in (1, 2, 3, 5, 6, 8, 9, 16):
        for start in (0, 5, batch - num_rows):
            part = tile_linear(native, x[start : start + num_rows], weight, packed=packed)
            assert torch.equal(part, full[start : start + num_rows]), (num_rows, start)


def test_thread_count_does_not_change_results(native, quant_cases):
    weight, _ = first_tiles(quant_cases[Q.Q4_1])
    x = activations(6, weight.in_features, seed=2)
    one, two = with_thread_counts(lambda: tile_linear(native, x, weight))
    assert torch.equal(one, two)


def test_the_float_tiles_run_only_where_they_apply(native, quant_cases):
    """Q4_0 / Q4_1 / Q8_0 whole tiles on AVX-512; a partial tile, another format or an AVX2 cap
    take the blocks as stored (same values as the AVX2 path, bit for bit)."""
    for qtype in FORMATS:
        case = quant_cases[qtype]
        whole, _ = first_tiles(case)
        assert float_tiles_run(whole) == (qtype in TILE_FORMATS)
        assert not float_tiles_run(case.weight)  # 37 rows
        packed = native.pack_tiles(case.weight.data, case.weight.qtype, case.weight.in_features)
        x = activations(3, case.weight.in_features)
        with_tiles = tile_linear(native, x, case.weight, packed=packed)
        assert torch.equal(with_tiles, qlinear(x, case.weight, isa="avx2"))
