"""kernels/sampling.py's argmax_rows: torch.argmax(x, dim=-1) exactly (first maximal index, the
first NaN where a row has one), whether numpy or torch computes it."""

from __future__ import annotations

import pytest
import torch

from kernels.sampling import argmax_rows


def edge_rows(vocab: int) -> torch.Tensor:
    """Random rows, then ties, NaNs, infinities, all -inf and signed zeros."""
    x = torch.randn(9, vocab, generator=torch.Generator().manual_seed(vocab))
    x[1, [3, vocab - 2]] = 40.0  # a tie: the first wins
    x[2, [vocab - 1, 5]] = float("nan")  # the first NaN wins over everything
    x[3, 7] = float("inf")
    x[4, [2, 6]] = float("inf")
    x[5] = float("-inf")
    x[6] = 0.0
    x[6, 4] = -0.0
    x[7, [0, vocab - 1]] = x[7].max() + 1
    x[8, 1] = float("nan")
    x[8, 0] = float("inf")
    return x


@pytest.mark.parametrize("vocab", [1, 8, 1000, 151936])
def test_matches_torch_argmax(vocab: int) -> None:
    x = edge_rows(max(vocab, 8))[:, :vocab].contiguous()
    got = argmax_rows(x)
    assert got.dtype == torch.int64
    assert torch.equal(got, x.argmax(dim=-1))


def test_views_other_dtypes_and_inference_mode() -> None:
    x = edge_rows(64)
    with torch.inference_mode():
        frozen = x.clone()
        assert torch.equal(argmax_rows(frozen), frozen.argmax(dim=-1))
    strided = x[:, ::3]
    assert torch.equal(argmax_rows(strided), strided.argmax(dim=-1))
    half = x.to(torch.float16)
    assert torch.equal(argmax_rows(half), half.argmax(dim=-1))
    assert argmax_rows(torch.empty(0, 5)).shape == (0,)
