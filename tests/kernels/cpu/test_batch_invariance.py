"""Batch invariance of the native quantized linear: a row's output is bitwise the same alone,
at any position of any batch (fused path up to 8 rows, panel path above, every remainder of
the 4-row tiles), and with 1 or 2 threads."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu import qlinear
from tests.kernels.cpu.quant_cases import FORMATS, ISAS, activations

BATCH = 131  # 32 tiles of 4 rows + 3: the panel path's remainder tile too


@pytest.fixture(autouse=True)
def needs_native(native):
    return native


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_a_row_is_bitwise_the_same_in_any_batch(quant_cases, qtype, isa):
    weight = quant_cases[qtype].weight
    x = activations(BATCH, weight.in_features, seed=1)
    bias = torch.randn(weight.out_features)
    full = qlinear(x, weight, bias, isa=isa)
    alone = torch.cat([qlinear(x[i : i + 1], weight, bias, isa=isa) for i in range(BATCH)])
    assert torch.equal(full, alone)
    for num_rows in (2, 3, 4, 5, 6, 7, 8, 9, 16, 33, 64):
        for start in (0, 5, BATCH - num_rows):
            part = qlinear(x[start : start + num_rows], weight, bias, isa=isa)
            assert torch.equal(part, full[start : start + num_rows]), (num_rows, start)


@pytest.mark.parametrize("num_rows", [1, 5, 40])
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_thread_count_does_not_change_results(quant_cases, qtype, num_rows):
    weight = quant_cases[qtype].weight
    x = activations(num_rows, weight.in_features, seed=2)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(qlinear(x, weight))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])


def test_results_are_not_trivially_equal(quant_cases):
    """Guard for the tests above: different rows give different outputs."""
    weight = quant_cases[FORMATS[0]].weight
    y = qlinear(activations(3, weight.in_features), weight)
    assert not torch.equal(y[0], y[1]) and y.abs().sum() > 0
