"""kernels/host_memory.py: zero-filled CPU tensors the OS backs page by page at first touch."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch

from kernels.host_memory import LAZY_BYTES, zeros

STATUS = Path("/proc/self/status")


def _resident_bytes() -> int:
    for line in STATUS.read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_large_tensors_read_as_zeros_and_hold_what_is_written(dtype):
    shape = (9, 2, 16, 2, 64)  # a KV layer's [blocks, K/V, block size, heads, head dim]
    tensor = zeros(shape, dtype, "cpu")
    assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
    assert not tensor.any()
    big = zeros((LAZY_BYTES // 4 + 7, 3), dtype, "cpu")
    assert big.shape == (LAZY_BYTES // 4 + 7, 3) and not big.any()
    big[-1, 2] = 1.5
    big[0].fill_(-2.0)
    assert float(big[-1, 2]) == 1.5 and float(big[0, 1]) == -2.0 and float(big[1].abs().sum()) == 0


def test_small_tensors_are_ordinary_zeros():
    tensor = zeros((3, 5), torch.float32, "cpu")
    assert torch.equal(tensor, torch.zeros(3, 5))


@pytest.mark.skipif(not STATUS.exists(), reason="needs /proc/self/status (Linux)")
def test_pages_are_resident_only_once_written():
    nbytes = 256 << 20
    before = _resident_bytes()
    tensor = zeros((nbytes // 4,), torch.float32, "cpu")
    allocated = _resident_bytes()
    tensor[: nbytes // 8].fill_(1.0)  # half of it written
    written = _resident_bytes()
    assert allocated - before < nbytes // 8, "the allocation itself made the pages resident"
    assert written - allocated > nbytes // 4, "writing half of it should fault that half in"


def test_the_mapping_is_freed_with_its_last_view():
    tensor = zeros((LAZY_BYTES,), torch.float32, "cpu")
    storage = weakref.ref(tensor.untyped_storage())
    view = tensor[10:20]
    del tensor
    gc.collect()
    assert storage() is not None  # the view keeps it
    view += 1
    del view
    gc.collect()
    assert storage() is None
