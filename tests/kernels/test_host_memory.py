"""kernels/host_memory.py: `zeroed` is torch.zeros (values, shape, dtype, a tensor of its own)
without writing the memory, and the backends' KV caches come out zero."""

from __future__ import annotations

import gc

import pytest
import torch

from kernels.attention import KVCacheSpec
from kernels.host_memory import zeroed
from kernels.reference import ReferenceBackend


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_zeroed_is_torch_zeros(dtype):
    shape = (3, 2, 16, 2, 8)
    cache = zeroed(shape, dtype, torch.device("cpu"))
    assert cache.shape == shape and cache.dtype == dtype and cache.is_contiguous()
    assert torch.equal(cache, torch.zeros(shape, dtype=dtype))


def test_zeroed_tensors_are_independent_and_outlive_their_maps():
    first, second = (zeroed((1 << 20,), torch.float32, torch.device("cpu")) for _ in range(2))
    view = first.view(2, -1)[1]
    del first
    gc.collect()
    view.fill_(3.0)  # the map is still there: the view holds it
    assert view.sum().item() == 3.0 * (1 << 19)
    assert second.abs().sum().item() == 0.0


def test_zeroed_empty_shape():
    assert zeroed((0, 4), torch.float32, torch.device("cpu")).shape == (0, 4)


def test_reference_backend_allocates_zero_caches():
    backend = ReferenceBackend()
    spec = KVCacheSpec(2, 4, 16, 2, 8, torch.float32, torch.device("cpu"))
    backend.allocate(spec)
    assert len(backend.kv_caches) == 2
    for cache in backend.kv_caches:
        assert cache.shape == (4, 2, 16, 2, 8) and not cache.any()
    backend.kv_caches[0].fill_(1.0)
    assert not backend.kv_caches[1].any()
