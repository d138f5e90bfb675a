"""FlashInferBackend against the reference backend on a CUDA GPU (marked gpu; skipped without
CUDA or flashinfer): decode, prefill, chunked prefill mixed with decodes, and tree masks, over
several head shapes, block sizes and dtypes; the decode CUDA-graph runner.

The reference runs in float32 on the same (already rounded) inputs, so the tolerance covers only
FlashInfer's half-precision arithmetic."""

from __future__ import annotations

import math
import random

import pytest
import torch

from kernels.attention import KVCacheSpec
from kernels.graph_shapes import GraphShapes
from tests.kernels.flashinfer_fakes import (
    attention_stack,
    graph_step_inputs,
    make_metadata,
    metadata_on,
    random_cases,
)

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

from kernels.cuda_graphs import StepGraphRunner  # noqa: E402
from kernels.flashinfer_backend import FlashInferBackend  # noqa: E402
from kernels.reference import ReferenceBackend  # noqa: E402

CUDA = torch.device("cuda")
NUM_LAYERS, NUM_BLOCKS = 2, 1024
SHAPES = [(32, 8, 64, torch.bfloat16), (16, 2, 128, torch.bfloat16), (8, 8, 64, torch.float16)]
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
KINDS = {
    "decode": ("decode",),
    "prefill": ("prefill",),
    "chunked": ("chunk", "decode", "prefill"),
    "tree": ("tree", "decode", "chunk"),
    "verify": ("verify", "decode"),
}


def make_backends(num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype):
    def spec(dt: torch.dtype) -> KVCacheSpec:
        return KVCacheSpec(NUM_LAYERS, NUM_BLOCKS, block_size, num_kv_heads, head_dim, dt, CUDA)

    fast, slow = FlashInferBackend(CUDA), ReferenceBackend()
    fast.allocate(spec(dtype))
    slow.allocate(spec(torch.float32))
    for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
        fast_cache.normal_()
        slow_cache.copy_(fast_cache[:NUM_BLOCKS].float())
    return fast, slow


def random_batch(rng: random.Random, kinds: tuple[str, ...], block_size: int, max_requests: int):
    """Random cases with histories stretched so that requests span many pages."""
    cases = random_cases(rng, rng.randint(1, max_requests), kinds)
    for case in cases:
        case.history *= rng.choice([1, 5, 20])
    return metadata_on(make_metadata(rng, cases, block_size, NUM_BLOCKS)[0], CUDA)


def random_qkv(n: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype):
    shapes = [(n, num_heads, head_dim), (n, num_kv_heads, head_dim), (n, num_kv_heads, head_dim)]
    return [torch.randn(shape, device=CUDA).to(dtype) for shape in shapes]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("num_heads, num_kv_heads, head_dim, dtype", SHAPES)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("seed", range(2))
def test_matches_reference(kind, num_heads, num_kv_heads, head_dim, dtype, block_size, seed):
    rng = random.Random(seed)
    fast, slow = make_backends(num_kv_heads, head_dim, block_size, dtype)
    metadata = random_batch(rng, KINDS[kind], block_size, max_requests=12)
    scale = 1 / math.sqrt(head_dim)
    fast.plan(metadata)
    slow.plan(metadata)
    tol = TOLERANCE[dtype]
    for layer in range(NUM_LAYERS):
        q, k, v = random_qkv(metadata.num_tokens, num_heads, num_kv_heads, head_dim, dtype)
        got = fast.forward(layer, q, k, v, scale)
        want = slow.forward(layer, q.float(), k.float(), v.float(), scale)
        torch.testing.assert_close(got.float(), want, atol=tol, rtol=tol)
        assert torch.equal(fast.kv_caches[layer][:NUM_BLOCKS].float(), slow.kv_caches[layer])


@pytest.mark.parametrize("kinds", [("decode",), ("verify",), ("decode", "verify")])
def test_graph_replay_matches_reference(kinds) -> None:
    """Decode and chain-verification steps replayed from captured graphs (padded to the
    captured batch size and query rows) give the reference's rows and cache."""
    num_heads, num_kv_heads, head_dim, dtype, block_size = 32, 8, 64, torch.bfloat16, 16
    scale = 1 / math.sqrt(head_dim)
    fast, slow = make_backends(num_kv_heads, head_dim, block_size, dtype)
    vocab = 97
    tables = [
        torch.randn(vocab, heads, head_dim, device=CUDA).to(dtype)
        for heads in (num_heads, num_kv_heads, num_kv_heads)
    ]
    runner = StepGraphRunner(
        fast,
        attention_stack(fast, tables, dtype, scale),
        GraphShapes((1, 2, 4, 8), 5),
        num_heads=num_heads,
        max_model_len=1024,
    )
    runner.capture()
    slow_step = attention_stack(slow, [t.float() for t in tables], torch.float32, scale)
    rng = random.Random(len(kinds))
    for _ in range(6):
        cases = random_cases(rng, rng.randint(1, 8), kinds)
        for case in cases:
            case.history *= rng.choice([1, 5, 20])
        metadata = make_metadata(rng, cases, block_size, NUM_BLOCKS)[0]  # host tensors
        ids, positions, rows = graph_step_inputs(rng, metadata, vocab)
        got = runner.run(ids, positions, metadata, rows)
        slow.plan(metadata_on(metadata, CUDA))
        want = slow_step(ids.to(CUDA), positions.to(CUDA))[rows.to(CUDA)]
        torch.testing.assert_close(got.float(), want, atol=2e-2, rtol=2e-2)
        for fast_cache, slow_cache in zip(fast.kv_caches, slow.kv_caches, strict=True):
            assert torch.equal(fast_cache[:NUM_BLOCKS].float(), slow_cache)
    assert runner.num_replays == 6


def test_float32_cache_is_refused_on_cuda() -> None:
    backend = FlashInferBackend(CUDA)
    spec = KVCacheSpec(1, 4, 16, 2, 64, torch.float32, CUDA)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        backend.allocate(spec)
