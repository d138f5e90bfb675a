"""FlashInferBackend's own logic on CPU, with FlashInfer's wrappers replaced by a torch emulation
of their documented semantics (tests/kernels/flashinfer_fakes.py): the wrapper choice per step,
one plan per step, the CSR/mask arguments, K/V writes by slot, copy_slots and decode padding —
compared with kernels.reference.ReferenceBackend on the same random batches.

What this cannot prove: that real FlashInfer kernels follow those semantics. That is
tests/kernels/test_flashinfer_gpu.py's job (marked gpu)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from kernels.attention import KVCacheSpec
from kernels.flashinfer_backend import FlashInferBackend
from kernels.flashinfer_metadata import pad_decode_metadata
from tests.kernels.flashinfer_fakes import (
    FakeDecodeWrapper,
    FakePrefillWrapper,
    fake_flashinfer_module,
    make_metadata,
    random_cases,
)

reference = pytest.importorskip("kernels.reference")

BLOCK_SIZE, NUM_BLOCKS, NUM_LAYERS = 4, 96, 2
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM = 4, 2, 8
SCALE = 1 / math.sqrt(HEAD_DIM)


def make_backends():
    spec = KVCacheSpec(
        NUM_LAYERS,
        NUM_BLOCKS,
        BLOCK_SIZE,
        NUM_KV_HEADS,
        HEAD_DIM,
        torch.float32,
        torch.device("cpu"),
    )
    fast = FlashInferBackend("cpu", flashinfer_module=fake_flashinfer_module())
    slow = reference.ReferenceBackend()
    fast.allocate(spec)
    slow.allocate(spec)
    # Same random history in both caches (the pad block, past NUM_BLOCKS, is FlashInfer's own).
    for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
        slow_cache.normal_()
        fast_cache[:NUM_BLOCKS] = slow_cache
    return fast, slow


def random_qkv(num_tokens: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(seed)
    shapes = [(NUM_HEADS, HEAD_DIM), (NUM_KV_HEADS, HEAD_DIM), (NUM_KV_HEADS, HEAD_DIM)]
    return [
        tuple(torch.randn(num_tokens, *shape, generator=generator) for shape in shapes)
        for _ in range(NUM_LAYERS)
    ]


def run_step(backend, metadata, qkv) -> list[torch.Tensor]:
    backend.plan(metadata)
    n = metadata.num_tokens
    return [
        backend.forward(layer, q[:n], k[:n], v[:n], SCALE) for layer, (q, k, v) in enumerate(qkv)
    ]


def assert_same_step(fast, slow, metadata, seed: int) -> None:
    qkv = random_qkv(metadata.num_tokens, seed)
    for got, want in zip(run_step(fast, metadata, qkv), run_step(slow, metadata, qkv), strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
        assert torch.equal(fast_cache[:NUM_BLOCKS], slow_cache)


@pytest.mark.parametrize(
    "kinds",
    [
        ("decode",),
        ("prefill",),
        ("prefill", "chunk", "decode"),
        ("tree",),
        ("tree", "chunk", "decode"),
    ],
)
@pytest.mark.parametrize("seed", range(5))
def test_backend_matches_reference(kinds, seed: int) -> None:
    rng = random.Random(seed)
    fast, slow = make_backends()
    cases = random_cases(rng, rng.randint(1, 6), kinds)
    metadata, _ = make_metadata(rng, cases, BLOCK_SIZE, NUM_BLOCKS)
    assert_same_step(fast, slow, metadata, seed)
    assert metadata.is_pure_decode == all(c.q_len == 1 for c in cases)
    wrapper = FakeDecodeWrapper if metadata.is_pure_decode else FakePrefillWrapper
    assert type(fast._active) is wrapper
    assert fast._active.num_plans == 1  # one plan per step, shared by every layer
    if any(c.parent_ids is not None for c in cases):
        assert fast._prefill.kwargs["custom_mask"] is not None
    elif wrapper is FakePrefillWrapper:
        assert fast._prefill.kwargs["causal"] and fast._prefill.kwargs["custom_mask"] is None


def test_set_attention_shape_plans_inside_plan_and_checks_the_scale() -> None:
    rng = random.Random(7)
    fast, _ = make_backends()
    fast.set_attention_shape(NUM_HEADS)
    metadata, _ = make_metadata(rng, random_cases(rng, 3, ("decode",)), BLOCK_SIZE, NUM_BLOCKS)
    fast.plan(metadata)
    assert fast._decode.num_plans == 1  # planned before any forward (CUDA-graph order)
    q = torch.randn(3, NUM_HEADS, HEAD_DIM)
    kv = torch.randn(3, NUM_KV_HEADS, HEAD_DIM)
    with pytest.raises(ValueError, match="softmax scale"):
        fast.forward(0, q, kv, kv, SCALE * 2)


def test_copy_slots_matches_reference_with_overlap() -> None:
    fast, slow = make_backends()
    src = torch.tensor([10, 11, 12, 40, 41])
    dst = torch.tensor([9, 10, 11, 3, 77])  # dst 10, 11 are also sources: read before write
    fast.copy_slots(src, dst)
    slow.copy_slots(src, dst)
    for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
        assert torch.equal(fast_cache[:NUM_BLOCKS], slow_cache)


@pytest.mark.parametrize("seed", range(3))
def test_padded_graph_decode_matches_reference(seed: int) -> None:
    """The CUDA-graph decode path minus the capture: graph wrappers, static rows, padding."""
    rng = random.Random(seed)
    fast, slow = make_backends()
    fast.set_attention_shape(NUM_HEADS)
    fast.enable_decode_graphs((1, 2, 4, 8), max_pages=16)
    metadata, _ = make_metadata(
        rng, random_cases(rng, rng.randint(1, 7), ("decode",)), BLOCK_SIZE, NUM_BLOCKS
    )
    n = metadata.num_requests
    padded = pad_decode_metadata(metadata, 8 if n > 4 else 4, fast.pad_block_id, BLOCK_SIZE)
    qkv = random_qkv(padded.num_tokens, seed)
    fast_out = run_step(fast, padded, qkv)
    assert fast._active.use_cuda_graph and fast._kv_rows.data_ptr() == fast._graph_rows.data_ptr()
    slow_out = run_step(slow, metadata, qkv)  # the same q/k/v rows for the real requests
    for layer in range(NUM_LAYERS):
        torch.testing.assert_close(fast_out[layer][:n], slow_out[layer][:n], atol=1e-5, rtol=1e-5)
    for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
        assert torch.equal(fast_cache[:NUM_BLOCKS], slow_cache)
