"""The integer-activation paths (act="int16" and "int8") over packed tiles, for every format:
activations quantized per row and group of 32 exactly as fallback.quantize_rows does; products
within float32 rounding of the exact product of those values and gguf's weights; the same bytes
on the AVX-512, AVX2 and scalar paths; a row bitwise the same alone or in any batch (past the
64-row blocks too) and with 1 or 2 threads; int16 within ~1e-4 of float32 activations."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from kernels.cpu import ISA, QuantizedWeight, fallback, load_native, pack_tiles, qlinear
from tests.kernels.cpu.quant_cases import FORMATS, Q, activations, with_thread_counts

MODES = ("int16", "int8")
ROW_COUNTS = (1, 2, 3, 5, 8, 16, 33, 512)
ACT = {"int8": 1, "int16": 2}


@pytest.fixture(autouse=True)
def needs_native(native):
    return native


def native_isas() -> list[str]:
    """The ISA paths this CPU runs (the test cap lowers auto to each)."""
    ops = load_native()
    return [isa for isa, ok in (("avx512", ops.cpu_has_avx512()), ("avx2", ops.cpu_has_avx2()),
                                ("scalar", True)) if ok]  # fmt: skip


def int_bound(values: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Rounding allowance: K * 2^-21 * sum_k |v_k| * m_k, m_k eight times the largest |w| of
    k's group (covers the formats' scale and offset terms, rounded apart)."""
    groups = weight.abs().reshape(weight.shape[0], -1, 32).amax(dim=-1)
    magnitude = 8 * groups.repeat_interleave(32, dim=1)
    return values.shape[1] * 2.0**-21 * (values.abs().double() @ magnitude.double().T)


@pytest.mark.parametrize("isa", ["avx2", "scalar"])
@pytest.mark.parametrize("act", MODES)
def test_native_quantization_equals_the_reference(act, isa):
    x = activations(9, 256, seed=3)
    x[2, :32] = 0.0  # an all-zero group: d = 0, q = 0
    x[4, 40] = 1e30  # one huge value: the rest of its group rounds to 0
    x[5, 64:96] = torch.arange(32) - 15.5  # a ramp over the whole range
    x[6, 128] = float("nan")  # a bad group: d = NaN, q = 0
    x[7, 160] = float("inf")
    hi, lo, d, sum16 = load_native().quantize_rows(x, ACT[act], ISA[isa])
    q_ref, d_ref = fallback.quantize_rows(x, fallback.LEVELS[act])
    q = hi.int() * 256 + lo.int() if act == "int16" else hi.int()
    good = torch.isfinite(d_ref).repeat_interleave(32, dim=1)
    assert torch.equal(d[torch.isfinite(d_ref)], d_ref[torch.isfinite(d_ref)])
    assert torch.equal(q[good], q_ref[good])
    assert d[6, 4].isnan() and d[7, 5].isnan() and (q[6, 128:160] == 0).all()
    assert torch.equal(sum16, q.reshape(9, -1, 16).sum(dim=-1))
    assert q.abs().max() == fallback.LEVELS[act] and (q[2, :32] == 0).all() and d[2, 0] == 0
    if act == "int16":  # the split: hi and lo are bytes, q = 256 hi + lo
        assert hi.abs().max() <= 127 and lo.min() >= -128


@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("act", MODES)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_matches_the_exact_product_of_the_quantized_rows(quant_cases, qtype, act, num_rows):
    case = quant_cases[qtype]
    x = activations(num_rows, case.weight.in_features, seed=num_rows)
    bias = torch.randn(case.weight.out_features)
    got = qlinear(x, case.weight, bias, act=act)
    values = fallback.int_values(x, act)
    exact = values.double() @ case.reference.double().T + bias.double()
    bound = int_bound(values, case.reference) + 1e-6
    assert ((got.double() - exact).abs() <= bound).all()
    assert not torch.equal(got, qlinear(x, case.weight, bias))  # not float32 activations
    fallback_result = fallback.qlinear(x, case.weight, bias, act=act)
    assert ((got.double() - fallback_result.double()).abs() <= 2 * bound).all()


@pytest.mark.parametrize("act", MODES)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_every_isa_gives_the_same_bytes(quant_cases, qtype, act):
    weight = quant_cases[qtype].weight
    packed = pack_tiles(weight)
    bias = torch.randn(weight.out_features)
    for num_rows in (1, 5, 70):  # 70: two row blocks
        x = activations(num_rows, weight.in_features, seed=num_rows)
        results = [
            qlinear(x, weight, bias, isa=isa, act=act, packed=packed) for isa in native_isas()
        ]
        assert all(torch.equal(results[0], other) for other in results[1:])


@pytest.mark.parametrize("act", MODES)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_a_row_is_bitwise_the_same_in_any_batch(quant_cases, qtype, act):
    weight = quant_cases[qtype].weight
    packed = pack_tiles(weight)
    batch = 133  # two 64-row blocks and a remainder; 4-row chunks and remainders in each

    def run(rows: torch.Tensor) -> torch.Tensor:
        return qlinear(rows, weight, act=act, packed=packed)

    x = activations(batch, weight.in_features, seed=1)
    full = run(x)
    assert torch.equal(full, torch.cat([run(x[i : i + 1]) for i in range(batch)]))
    for num_rows in (2, 3, 4, 5, 9, 16, 65):
        for start in (0, 5, batch - num_rows):
            assert torch.equal(run(x[start : start + num_rows]), full[start : start + num_rows])


@pytest.mark.parametrize("num_rows", [1, 5, 70])
@pytest.mark.parametrize("act", MODES)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_thread_count_does_not_change_results(quant_cases, qtype, act, num_rows):
    weight = quant_cases[qtype].weight
    x = activations(num_rows, weight.in_features, seed=2)
    one, two = with_thread_counts(lambda: qlinear(x, weight, act=act))
    assert torch.equal(one, two)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_int16_is_near_float32_activations(quant_cases, qtype):
    """int16's step is 1/32639 of a group's largest value, int8's 1/127: against the exact
    float32-activation product, int16's error is ~1e-5 of the output's scale and hundreds of
    times below int8's."""
    case = quant_cases[qtype]
    x = activations(16, case.weight.in_features, seed=4)
    exact = x.double() @ case.reference.double().T
    scale = x.abs().double() @ case.reference.abs().double().T
    errors = {act: ((qlinear(x, case.weight, act=act).double() - exact).abs() / scale).max()
              for act in MODES}  # fmt: skip
    assert errors["int16"] < 3e-5 and errors["int16"] * 100 < errors["int8"]


def test_a_non_finite_row_stays_in_its_row(quant_cases):
    weight = quant_cases[Q.Q4_K].weight
    x = activations(3, weight.in_features, seed=6)
    clean = qlinear(x, weight, act="int16")
    x[1, 7] = float("nan")
    got = qlinear(x, weight, act="int16")
    assert got[1].isnan().all()
    assert torch.equal(got[0], clean[0]) and torch.equal(got[2], clean[2])


def _all_codes_max(qtype: Q, block_bytes: int, scale_at: int) -> QuantizedWeight:
    """16 rows of one 256-input super-block run (or 8 small blocks) with every byte 0xFF (every
    weight code and sub-block scale at its largest) but the f16 super-scale, and no min."""
    blocks = np.full((16, 256 // gguf.GGML_QUANT_SIZES[qtype][0] * block_bytes), 0xFF, np.uint8)
    per_row = blocks.reshape(16, -1, block_bytes)
    per_row[:, :, scale_at : scale_at + 2] = np.array([0.01], np.float16).view(np.uint8)
    if qtype in (Q.Q4_K, Q.Q5_K, Q.Q4_1):  # dmin (Q4_1: m) = 0: the codes alone
        per_row[:, :, 2:4] = 0
    return QuantizedWeight(int(qtype), torch.from_numpy(blocks), 256)


def test_extreme_weights_and_activations():
    """Every code at its largest (Q8_0 at +-127, Q6_K 63, Q5 31, Q4 15) against the largest
    activations of one sign, the other, mixed, and Q8_0's own signs: the biggest integer sums (the AVX2
    path's int16 partial sums and the q + 128 offset included) neither saturate nor overflow,
    on every ISA."""
    rng = np.random.default_rng(5)
    signs = rng.choice([-1.0, 1.0], size=(16, 256)).astype(np.float32)
    q8 = QuantizedWeight(int(Q.Q8_0), torch.from_numpy(gguf.quants.quantize(signs, Q.Q8_0)), 256)
    q6_blocks = np.full((16, 210), 0xFF, dtype=np.uint8)  # every code 63: u - 32 = 31
    q6_blocks[:, 192:208] = 127  # int8 scales at their largest
    q6_blocks[:, 208:210] = np.array([0.01], dtype=np.float16).view(np.uint8)
    q6 = QuantizedWeight(int(Q.Q6_K), torch.from_numpy(q6_blocks), 256)
    largest = [
        _all_codes_max(Q.Q4_K, 144, 0),
        _all_codes_max(Q.Q5_K, 176, 0),
        _all_codes_max(Q.Q4_0, 18, 0),
        _all_codes_max(Q.Q5_0, 22, 0),
        _all_codes_max(Q.Q4_1, 20, 0),
    ]
    rows = [np.full(256, 3.0), np.full(256, -3.0), rng.choice([-3.0, 3.0], size=256), 3 * signs[0]]
    x = torch.from_numpy(np.stack(rows)).float()  # the last: Q8_0's first row, sign for sign
    for weight in (q8, q6, *largest):
        reference = fallback.dequantize(weight)
        for act in MODES:
            values = fallback.int_values(x, act)
            exact = values.double() @ reference.double().T
            for isa in native_isas():
                got = qlinear(x, weight, act=act, isa=isa).double()
                assert ((got - exact).abs() <= int_bound(values, reference)).all()
            largest_possible = values.abs().double() @ reference.abs().double().T
            assert (exact.abs() == largest_possible).any()  # some sum is at its extreme


def test_packing_and_its_checks(quant_cases):
    ops = load_native()
    weight = quant_cases[Q.Q4_0].weight  # 37 rows: two full tiles and a padded one
    packed = pack_tiles(weight)
    assert packed.shape[0] == 3
    x, out = activations(1, weight.in_features), torch.empty(1, weight.out_features)
    with pytest.raises(RuntimeError, match="pass packed"):
        ops.qlinear_out(x, weight.data, weight.qtype, None, out, 0, 2)
    with pytest.raises(RuntimeError, match="pack_tiles"):  # tiles of other weights
        ops.qlinear_out(x, weight.data, weight.qtype, None, out, 0, 2, packed[:1])
    with pytest.raises(RuntimeError, match="act must be"):
        ops.qlinear_out(x, weight.data, weight.qtype, None, out, 0, 7, packed)
    with pytest.raises(RuntimeError, match="isa must be"):
        ops.qlinear_out(x, weight.data, weight.qtype, None, out, 9, 2, packed)
