"""The native CPU attention backend (kernels/cpu/paged_attention.py) against the reference backend on
random ragged batches (prefill, chunks with history, decodes, trees; GQA; AVX2 and scalar head
sizes; sliding windows), and its two invariances: a row's output does not depend on the rest of the batch, and
a token verified inside a chain gets bitwise the output a plain decode step gives it; and the
output does not depend on the thread count (which splits a KV head's query heads over tasks)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from kernels.attention import KVCacheSpec
from kernels.reference import ReferenceBackend
from tests.kernels.flashinfer_fakes import RequestCase, make_metadata, random_cases

pytestmark = pytest.mark.usefixtures("native", "attention_isa")
NUM_BLOCKS, NUM_LAYERS = 256, 2
KINDS = {"prefill": ("prefill",), "chunk": ("chunk",), "decode": ("decode",), "tree": ("tree",)}
KINDS["mixed"] = ("prefill", "chunk", "decode", "tree")
# (query heads, KV heads, head_dim): SmolLM2's 9/3/64, MHA, a head size off the vector paths,
# Qwen2.5-0.5B's 14/2/64, a Llama-like 8/2/128 (the AVX-512 path's values in two chunks) and
# ten query heads on one KV head (a group split over two tasks).
SHAPES = [(9, 3, 64), (4, 4, 32), (6, 2, 12), (14, 2, 64), (8, 2, 128), (10, 1, 32)]


@pytest.fixture(params=[2, 1], ids=["widest", "avx2"])
def attention_isa(request, native):
    """Every test runs on the widest attention path this CPU has (AVX-512 per KV head where it
    exists) and on the AVX2 path (per query head)."""
    native.set_attention_isa_cap(request.param)
    yield request.param
    native.set_attention_isa_cap(2)


# What the cache stores: float32, or 16-bit floats the kernels widen on load.
KV_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def backends(
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    kv_dtype=torch.float32,
    windows: tuple[int, ...] = (),
):
    from kernels.cpu.paged_attention import CpuPagedBackend

    spec = KVCacheSpec(
        NUM_LAYERS, NUM_BLOCKS, block_size, num_kv_heads, head_dim, kv_dtype, "cpu", windows
    )
    fast, slow = CpuPagedBackend(), ReferenceBackend()
    fast.allocate(spec)
    slow.allocate(spec)
    return fast, slow


def qkv(n: int, heads: int, kv_heads: int, head_dim: int, generator: torch.Generator):
    fused = torch.randn(n, (heads + 2 * kv_heads) * head_dim, generator=generator)
    view = fused.view(n, heads + 2 * kv_heads, head_dim)  # strided q/k/v, as the model passes
    return view[:, :heads], view[:, heads : heads + kv_heads], view[:, heads + kv_heads :]


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES)
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("seed", range(3))
def test_matches_reference(kind, heads, kv_heads, head_dim, block_size, seed) -> None:
    check_against_reference(kind, heads, kv_heads, head_dim, block_size, seed, torch.float32)


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("heads, kv_heads, head_dim", SHAPES)
@pytest.mark.parametrize("seed", range(2))
def test_a_16_bit_cache_matches_reference(kv_dtype, heads, kv_heads, head_dim, seed) -> None:
    """Both backends read the same rounded keys and values: the outputs agree as closely as
    with a float32 cache, and the kernel rounds what it writes exactly as torch does."""
    dtype = KV_DTYPES[kv_dtype]
    check_against_reference("mixed", heads, kv_heads, head_dim, 16, seed, dtype)


# Layer 0 slides (windows from one key, below a block, across blocks, past most histories),
# layer 1 attends to everything: one plan serves both.
@pytest.mark.parametrize("window", [1, 3, 7, 20])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [SHAPES[0], SHAPES[2], SHAPES[4]])
@pytest.mark.parametrize("seed", range(2))
def test_sliding_windows_match_reference(window, heads, kv_heads, head_dim, seed) -> None:
    check_against_reference("mixed", heads, kv_heads, head_dim, 4, seed, torch.float32, (window, 0))


def check_against_reference(
    kind, heads, kv_heads, head_dim, block_size, seed, kv_dtype, windows=()
) -> None:
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    fast, slow = backends(kv_heads, head_dim, block_size, kv_dtype, windows)
    cases = random_cases(rng, rng.randint(1, 6), KINDS[kind])
    metadata, _ = make_metadata(rng, cases, block_size, NUM_BLOCKS)
    fast.plan(metadata)
    slow.plan(metadata)
    scale = 1 / math.sqrt(head_dim)
    for layer in range(NUM_LAYERS):
        # Fill the history too: random K/V everywhere, the same in both caches.
        history = torch.randn(slow.kv_caches[layer].shape, generator=generator)
        fast.kv_caches[layer].copy_(history)
        slow.kv_caches[layer].copy_(history)
        q, k, v = qkv(metadata.num_tokens, heads, kv_heads, head_dim, generator)
        got = fast.forward(layer, q, k, v, scale)
        want = slow.forward(layer, q, k, v, scale)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        assert torch.equal(fast.kv_caches[layer], slow.kv_caches[layer])


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_writes_round_like_torch_at_the_edges(kv_dtype: str) -> None:
    """Ties, overflow, subnormals, signed zeros, infinities: the kernel's store gives torch's
    bits (NaN stays NaN)."""
    dtype = KV_DTYPES[kv_dtype]
    fast, _ = backends(1, 16, 16, dtype)
    tiny, big = torch.finfo(dtype).tiny, torch.finfo(dtype).max
    eps = torch.finfo(dtype).eps
    edges = [
        0.0,
        -0.0,
        1.0 + eps / 2,
        1.0 + 1.5 * eps,
        -(1.0 + eps / 2),
        big,
        big * 1.0001,
        -big * 1.001,
        tiny / 2,
        tiny / 3,
        tiny * 0.75,
        -tiny / 1024,
        1e-30,
        65519.0,
        65520.0,
        float("inf"),
        float("-inf"),
        3.0e38,
        1.0 / 3.0,
        -2.5e-8,
        6.0e-8,
        1.0e-45,
    ]
    values = torch.tensor(edges + [0.0] * (-len(edges) % 16), dtype=torch.float32).view(-1, 1, 16)
    n = values.shape[0]
    metadata, _ = make_metadata(random.Random(0), [RequestCase(0, n)], 16, NUM_BLOCKS)
    fast.plan(metadata)
    fast.forward(0, torch.zeros(n, 1, 16), values, values, 1.0)
    slots = metadata.slot_mapping.long()
    written = fast.kv_caches[0].view(-1, 2, 16, 1, 16)  # [blocks, k|v, slot, head, D]
    keys = written[slots // 16, 0, slots % 16, 0]
    assert torch.equal(keys.view(torch.int16), values[:, 0].to(dtype).view(torch.int16))
    nan = fast.kv_caches[0].clone()
    fast.plan(metadata)
    fast.forward(0, torch.zeros(n, 1, 16), torch.full_like(values, float("nan")), values, 1.0)
    assert fast.kv_caches[0].view(-1, 2, 16, 1, 16)[slots // 16, 0, slots % 16, 0].isnan().all()
    assert not torch.equal(nan, fast.kv_caches[0])


def run_alone_and_batched(cases: list[RequestCase], seed: int, kv_dtype=torch.float32):
    """Each request's output alone (one plan per request) and inside the whole batch."""
    rng, generator = random.Random(seed), torch.Generator().manual_seed(seed)
    fast, _ = backends(3, 64, 16, kv_dtype)
    metadata, _ = make_metadata(rng, cases, 16, NUM_BLOCKS)
    fast.kv_caches[0].copy_(torch.randn(fast.kv_caches[0].shape, generator=generator))
    q, k, v = qkv(metadata.num_tokens, 9, 3, 64, generator)
    snapshot = fast.kv_caches[0].clone()
    fast.plan(metadata)
    batched = fast.forward(0, q, k, v, 0.125)
    starts = metadata.query_start_loc.tolist()
    for i in range(len(cases)):
        fast.kv_caches[0].copy_(snapshot)
        rows = slice(starts[i], starts[i + 1])
        fast.plan(single_request(metadata, i, rows))
        yield batched[rows], fast.forward(0, q[rows], k[rows], v[rows], 0.125)


def single_request(metadata, i: int, rows: slice):
    from kernels.attention import AttentionMetadata

    q_len = rows.stop - rows.start
    masks = metadata.tree_masks[i : i + 1] if metadata.tree_masks else ()
    return AttentionMetadata(
        query_start_loc=torch.tensor([0, q_len], dtype=torch.int32),
        seq_lens=metadata.seq_lens[i : i + 1],
        block_tables=metadata.block_tables[i : i + 1],
        slot_mapping=metadata.slot_mapping[rows],
        query_lens_host=(q_len,),
        seq_lens_host=metadata.seq_lens_host[i : i + 1],
        tree_masks=masks,
    )


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize("seed", range(4))
def test_a_request_is_bitwise_the_same_alone_and_in_a_batch(seed: int, kv_dtype: str) -> None:
    cases = random_cases(random.Random(100 + seed), 6, KINDS["mixed"])
    for batched, alone in run_alone_and_batched(cases, seed, KV_DTYPES[kv_dtype]):
        assert torch.equal(batched, alone)


@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (10, 1)])
@pytest.mark.parametrize(
    "cases",
    [[RequestCase(700, 1)], [RequestCase(0, 80), RequestCase(150, 5), RequestCase(600, 1)]],
    ids=["one-decode", "prefill-chain-decode"],
)
def test_the_output_does_not_depend_on_the_thread_count(heads, kv_heads, cases) -> None:
    """One decode (fewer tasks than threads: its heads are split over more tasks) and a prefill
    beside a chain and a decode (tasks handed out first, last, second, ...), at 1, 2 and 3
    threads, all past the size where attention forks: bitwise the same output."""
    rng, generator = random.Random(5), torch.Generator().manual_seed(5)
    fast, _ = backends(kv_heads, 64, 16)
    metadata, _ = make_metadata(rng, cases, 16, NUM_BLOCKS)
    fast.kv_caches[0].copy_(torch.randn(fast.kv_caches[0].shape, generator=generator))
    q, k, v = qkv(metadata.num_tokens, heads, kv_heads, 64, generator)
    outputs, threads = [], torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            fast.plan(metadata)
            outputs.append(fast.forward(0, q, k, v, 0.125))
    finally:
        torch.set_num_threads(threads)
    assert outputs[0].abs().sum() > 0
    assert all(torch.equal(out, outputs[0]) for out in outputs[1:])


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize("window", [0, 9])
def test_a_chain_token_gets_the_output_of_a_decode_step(window, kv_dtype: str) -> None:
    """Verify a 5-token chain after 37 tokens of history, then decode each of those tokens on
    its own over the same cache: the outputs are bitwise equal (with a sliding window too)."""
    generator = torch.Generator().manual_seed(7)
    fast, _ = backends(3, 64, 16, KV_DTYPES[kv_dtype], (window, window))
    fast.kv_caches[0].copy_(torch.randn(fast.kv_caches[0].shape, generator=generator))
    history, chain = 37, 5
    cases = [RequestCase(history, chain)]
    metadata, _ = make_metadata(random.Random(1), cases, 16, NUM_BLOCKS)
    q, k, v = qkv(chain, 9, 3, 64, generator)
    fast.plan(metadata)
    verified = fast.forward(0, q, k, v, 0.125)
    for j in range(chain):
        step = single_request(metadata, 0, slice(j, j + 1))
        step = type(step)(**{**step.__dict__, "seq_lens_host": (history + j + 1,)})
        fast.plan(step)
        decoded = fast.forward(0, q[j : j + 1], k[j : j + 1], v[j : j + 1], 0.125)
        assert torch.equal(decoded[0], verified[j])


@pytest.mark.parametrize("kv_dtype", sorted(KV_DTYPES))
@pytest.mark.parametrize("window", [0, 9])
def test_a_tree_node_gets_the_output_of_decoding_its_path(window, kv_dtype: str) -> None:
    """Verify a tree (root + six nodes, unseen siblings between a node and its ancestors), then,
    on a copy of the cache, decode one path's tokens one by one at consecutive positions (as
    after acceptance): each gets bitwise its node's verified output (the softmax sums the seen
    keys by rank, not by position)."""
    from kernels.attention import AttentionMetadata

    generator = torch.Generator().manual_seed(11)
    dtype, windows = KV_DTYPES[kv_dtype], (window, window)
    tree, decode = backends(3, 64, 16, dtype, windows)[0], backends(3, 64, 16, dtype, windows)[0]
    initial = torch.randn(tree.kv_caches[0].shape, generator=generator)
    tree.kv_caches[0].copy_(initial)
    decode.kv_caches[0].copy_(initial)
    history, parents = 37, (None, None, 0, 1, 2, 3)
    metadata, block_ids = make_metadata(
        random.Random(2), [RequestCase(history, 7, parents)], 16, NUM_BLOCKS
    )
    q, k, v = qkv(7, 9, 3, 64, generator)
    tree.plan(metadata)
    verified = tree.forward(0, q, k, v, 0.125)
    path = [0, 2, 4, 6]  # root, node 1, node 3, node 5
    for depth, row in enumerate(path):
        position = history + depth
        slot = block_ids[0][position // 16] * 16 + position % 16
        step = AttentionMetadata(
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
            seq_lens=torch.tensor([position + 1], dtype=torch.int32),
            block_tables=metadata.block_tables,
            slot_mapping=torch.tensor([slot]),
            query_lens_host=(1,),
            seq_lens_host=(position + 1,),
        )
        decode.plan(step)
        decoded = decode.forward(0, q[row : row + 1], k[row : row + 1], v[row : row + 1], 0.125)
        assert torch.equal(decoded[0], verified[row]), depth
