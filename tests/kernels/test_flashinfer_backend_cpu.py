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
from kernels.cuda_graphs import StepGraphRunner
from kernels.flashinfer_backend import FlashInferBackend
from kernels.flashinfer_metadata import kv_cache_rows, pad_uniform
from kernels.graph_shapes import GraphShapes
from tests.kernels.flashinfer_fakes import (
    FakeDecodeWrapper,
    FakePrefillWrapper,
    attention_stack,
    fake_flashinfer_module,
    graph_step_inputs,
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


@pytest.mark.parametrize("kinds", [("decode",), ("verify",), ("decode", "verify")])
@pytest.mark.parametrize("seed", range(4))
def test_padded_graph_step_matches_reference(kinds, seed: int) -> None:
    """The CUDA-graph path minus the capture: a batch padded to (batch size, query rows) on its
    graph wrapper; real rows equal the reference on the unpadded batch, and dummy rows write
    only the pad block."""
    rng = random.Random(seed)
    fast, slow = make_backends()
    fast.set_attention_shape(NUM_HEADS)
    shapes = [(b, q) for b in (1, 2, 4, 8) for q in range(1, 6)]
    fast.enable_graphs(shapes, max_pages=24)
    metadata, _ = make_metadata(
        rng, random_cases(rng, rng.randint(1, 7), kinds), BLOCK_SIZE, NUM_BLOCKS
    )
    n, q_len = metadata.num_requests, max(metadata.query_lens_host)
    padded = pad_uniform(metadata, 8 if n > 4 else 4, q_len, fast.pad_block_id, BLOCK_SIZE)
    qkv = random_qkv(padded.num_rows, seed)
    fast.plan_graph(padded.metadata, kv_cache_rows(padded.metadata.slot_mapping, BLOCK_SIZE))
    assert fast._active is fast._graph_wrappers[(padded.metadata.num_requests, q_len)]
    assert fast._active.use_cuda_graph and fast._active.num_plans == 1
    rows = torch.from_numpy(padded.rows)
    fast_out = [fast.forward(layer, q, k, v, SCALE) for layer, (q, k, v) in enumerate(qkv)]
    slow_out = run_step(slow, metadata, [tuple(t[rows] for t in layer) for layer in qkv])
    for layer in range(NUM_LAYERS):
        torch.testing.assert_close(fast_out[layer][rows], slow_out[layer], atol=1e-5, rtol=1e-5)
    for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
        assert torch.equal(fast_cache[:NUM_BLOCKS], slow_cache)


@pytest.mark.parametrize("kinds", [("decode",), ("verify",), ("decode", "verify", "chunk")])
@pytest.mark.parametrize("seed", range(3))
def test_step_graph_runner_matches_reference(kinds, seed: int) -> None:
    """StepGraphRunner's host side on CPU (its "graphs" run the step eagerly here): padding,
    the one staged buffer (ids, positions, K/V rows, gather rows), plan_graph and the gather
    give the reference's rows; steps it cannot replay are refused."""
    rng = random.Random(seed)
    fast, slow = make_backends()
    vocab = 53
    tables = [
        torch.randn(vocab, heads, HEAD_DIM) for heads in (NUM_HEADS, NUM_KV_HEADS, NUM_KV_HEADS)
    ]
    shapes = GraphShapes((1, 2, 4, 8), 5)
    runner = StepGraphRunner(
        fast, attention_stack(fast, tables, torch.float32, SCALE), shapes,
        num_heads=NUM_HEADS, max_model_len=64,
    )  # fmt: skip
    runner.capture()
    slow_step = attention_stack(slow, tables, torch.float32, SCALE)
    for _ in range(4):
        metadata, _ = make_metadata(
            rng, random_cases(rng, rng.randint(1, 8), kinds), BLOCK_SIZE, NUM_BLOCKS
        )
        ids, positions, rows = graph_step_inputs(rng, metadata, vocab)
        if not runner.can_run(metadata):  # a chunk longer than 5 rows
            assert max(metadata.query_lens_host) > 5
            with pytest.raises(ValueError, match="no captured graph"):
                runner.run(ids, positions, metadata, rows)
            continue
        got = runner.run(ids, positions, metadata, rows)
        slow.plan(metadata)
        want = slow_step(ids, positions)[rows]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
            assert torch.equal(fast_cache[:NUM_BLOCKS], slow_cache)
