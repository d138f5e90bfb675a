"""kernels/sampling.py's topk_rows: each row's k largest entries' indices, largest first, ties
by the lower index (a stable descending sort's first k), on the native kernel's AVX2 and
portable blocks and on the PyTorch fallback."""

from __future__ import annotations

import pytest
import torch

from kernels import sampling
from kernels.cpu.build import load_native
from kernels.sampling import topk_rows

native = load_native()
needs_native = pytest.mark.skipif(native is None, reason="the native CPU kernels did not build")


def reference(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[:, :k]


def rows(vocab: int) -> torch.Tensor:
    """Random rows, then ties (across a block's edge too), infinities and a constant row."""
    x = torch.randn(7, vocab, generator=torch.Generator().manual_seed(vocab))
    x[1, [vocab - 1, 0, vocab // 2]] = 50.0  # three equal leaders: lower index first
    x[2] = torch.round(x[2] * 2)  # many ties everywhere
    x[3, [vocab // 3, vocab - 1]] = float("inf")
    x[4] = float("-inf")
    x[5] = 1.5
    x[6] = torch.arange(vocab, dtype=torch.float32)  # ascending: every block holds a new best
    return x


@needs_native
@pytest.mark.parametrize("vocab", [1, 8, 63, 64, 65, 129, 1000, 151936])
@pytest.mark.parametrize("k", [1, 3, 8, 16])
@pytest.mark.parametrize("avx2", [True, False])
def test_the_kernel_is_a_stable_descending_sorts_first_k(vocab: int, k: int, avx2: bool) -> None:
    if k > vocab:
        pytest.skip("k > V")
    x = rows(vocab)
    got = native.topk_rows(x, k, avx2)
    assert got.dtype == torch.int64 and got.shape == (7, k)
    assert torch.equal(got, reference(x, k))


@needs_native
def test_without_ties_it_is_torch_topk() -> None:
    x = torch.randn(12, 151936, generator=torch.Generator().manual_seed(1))
    assert torch.equal(topk_rows(x, 8), torch.topk(x, 8).indices)


def test_the_fallback_answers_as_torch_does(monkeypatch) -> None:
    monkeypatch.setattr(sampling, "load_native", lambda: None)
    x = torch.randn(3, 500, generator=torch.Generator().manual_seed(2))
    assert torch.equal(topk_rows(x, 5), torch.topk(x, 5).indices)
    assert torch.equal(topk_rows(x.double(), 5), torch.topk(x.double(), 5).indices)


@needs_native
def test_views_large_k_and_bad_shapes() -> None:
    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(3))
    view = x[:, ::2]  # not contiguous: copied first
    assert torch.equal(topk_rows(view, 4), reference(view, 4))
    assert torch.equal(topk_rows(x, 300), torch.topk(x, 300).indices)  # past the kernel's 256
    with pytest.raises(RuntimeError):
        native.topk_rows(x, 0)
    with pytest.raises(RuntimeError):
        native.topk_rows(x[0], 2)
