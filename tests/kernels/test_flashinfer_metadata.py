"""FlashInfer metadata (CSR pages, flattened masks, cache rows, decode padding) on CPU, checked
against the reference backend's view of the same batch: request i's history is the slots
block_tables[i][p // block_size] * block_size + p % block_size for positions p < seq_len, its new
tokens are the last q_len of them, and its mask is "history visible, then causal or the tree".
Also: the registry picks the reference backend on CPU and says so in one log line."""

from __future__ import annotations

import logging
import random

import pytest
import torch

from kernels import registry
from kernels.flashinfer_metadata import (
    build_custom_mask,
    build_paged_kv_layout,
    kv_cache_rows,
    last_page_len,
    pad_uniform,
    request_mask,
)
from kernels.graph_shapes import GraphShapes
from tests.kernels.flashinfer_fakes import RequestCase, make_metadata, random_cases

KINDS = ("prefill", "chunk", "decode", "tree")
SEEDS = range(12)


def reference_history_slots(metadata, i: int, block_size: int) -> list[int]:
    table = metadata.block_tables[i].tolist()
    return [
        table[p // block_size] * block_size + p % block_size
        for p in range(metadata.seq_lens_host[i])
    ]


def csr_history_slots(layout, i: int, block_size: int) -> list[int]:
    """Expand FlashInfer's CSR view of request i back into token slots."""
    lo, hi = int(layout.kv_indptr[i]), int(layout.kv_indptr[i + 1])
    pages = layout.kv_indices[lo:hi].tolist()
    slots = [page * block_size + o for page in pages for o in range(block_size)]
    return slots[: (len(pages) - 1) * block_size + int(layout.kv_last_page_len[i])]


def random_batch(seed: int, block_size: int, kinds=KINDS):
    rng = random.Random(seed)
    cases = random_cases(rng, rng.randint(1, 9), kinds)
    metadata, _ = make_metadata(rng, cases, block_size, num_blocks=256)
    return cases, metadata


@pytest.mark.parametrize("block_size", [1, 4, 16])
@pytest.mark.parametrize("seed", SEEDS)
def test_csr_pages_hold_exactly_the_reference_history(seed: int, block_size: int) -> None:
    cases, metadata = random_batch(seed, block_size)
    layout = build_paged_kv_layout(metadata, block_size)
    assert layout.qo_indptr.tolist() == metadata.query_start_loc.tolist()
    for tensor in (layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len):
        assert tensor.dtype == torch.int32
    assert int(layout.kv_indptr[-1]) == layout.kv_indices.numel()
    new_slots = metadata.slot_mapping.tolist()
    for i, case in enumerate(cases):
        assert 1 <= int(layout.kv_last_page_len[i]) <= block_size
        history = reference_history_slots(metadata, i, block_size)
        assert csr_history_slots(layout, i, block_size) == history
        # The new tokens are the tail of that history, in row order.
        start = int(metadata.query_start_loc[i])
        assert new_slots[start : start + case.q_len] == history[case.history :]


def test_last_page_len_is_never_zero() -> None:
    assert [last_page_len(n, 4) for n in range(1, 10)] == [1, 2, 3, 4, 1, 2, 3, 4, 1]


def ancestors_and_self(case: RequestCase, node: int) -> set[int]:
    """Columns (new-token indices) tree node `node` may see: real tokens, ancestors, itself."""
    seen = set(range(case.num_real))
    while node is not None:
        seen.add(case.num_real + node)
        node = case.parent_ids[node]
    return seen


@pytest.mark.parametrize("seed", SEEDS)
def test_custom_mask_is_history_then_causal_or_tree(seed: int) -> None:
    cases, metadata = random_batch(seed, 4)
    flat = build_custom_mask(metadata)
    assert flat.dtype == torch.bool
    assert flat.numel() == sum(c.q_len * c.seq_len for c in cases)
    offset = 0
    for case in cases:
        mask = flat[offset : offset + case.q_len * case.seq_len].view(case.q_len, case.seq_len)
        offset += case.q_len * case.seq_len
        assert mask[:, : case.history].all()
        new = mask[:, case.history :]
        for row in range(case.q_len):
            visible = set(torch.nonzero(new[row]).flatten().tolist())
            if case.parent_ids is None or row < case.num_real:
                assert visible == set(range(row + 1))
            else:
                assert visible == ancestors_and_self(case, row - case.num_real)


def test_request_mask_rejects_a_tree_mask_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match="tree mask shape"):
        request_mask(3, 5, torch.ones(2, 2, dtype=torch.bool))


def test_layout_rejects_inconsistent_lengths() -> None:
    rng = random.Random(0)
    metadata, _ = make_metadata(rng, [RequestCase(3, 2)], 4, 16, extra_cols=0)
    with pytest.raises(ValueError, match="block table has"):
        build_paged_kv_layout(metadata, 2)  # 5 tokens need 3 blocks of 2; the table has 2
    bad = metadata.__class__(**{**metadata.__dict__, "query_lens_host": (6,)})
    with pytest.raises(ValueError, match="query_len"):
        build_paged_kv_layout(bad, 4)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_kv_cache_rows_address_k_and_v_of_each_slot(block_size: int) -> None:
    torch.manual_seed(block_size)
    num_blocks, heads, dim = 8, 2, 3
    slots = torch.randperm(num_blocks * block_size)[:7]
    k, v = torch.randn(7, heads, dim), torch.randn(7, heads, dim)
    cache = torch.zeros(num_blocks, 2, block_size, heads, dim)
    rows = kv_cache_rows(slots, block_size)
    flat = cache.view(-1, heads, dim)
    flat.index_copy_(0, rows[0], k)
    flat.index_copy_(0, rows[1], v)
    expected = torch.zeros_like(cache)
    for j, slot in enumerate(slots.tolist()):
        expected[slot // block_size, 0, slot % block_size] = k[j]
        expected[slot // block_size, 1, slot % block_size] = v[j]
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("block_size", [2, 4, 16])
@pytest.mark.parametrize("seed", range(6))
def test_pad_uniform_keeps_each_real_row_its_history_and_slot(seed: int, block_size: int) -> None:
    """Request i's real row j lands at row i * Q + j with the same slot and the same visible
    history (causal from the end of its declared length); dummy rows and dummy requests write
    only the pad block, and pages past a request's own are the pad block."""
    pad_block = 250
    cases, metadata = random_batch(seed, block_size, kinds=("decode", "verify"))
    n, q_len = metadata.num_requests, max(metadata.query_lens_host) + seed % 2
    padded = pad_uniform(metadata, n + seed % 3, q_len, pad_block, block_size)
    meta = padded.metadata
    assert meta.query_lens_host == (q_len,) * meta.num_requests and not meta.tree_masks
    assert meta.query_start_loc.tolist() == [q_len * i for i in range(meta.num_requests + 1)]
    layout = build_paged_kv_layout(meta, block_size)
    slots = meta.slot_mapping.tolist()
    real = set(padded.rows.tolist())
    for i, case in enumerate(cases):
        history = reference_history_slots(metadata, i, block_size)
        padded_history = csr_history_slots(layout, i, block_size)
        for j in range(case.q_len):
            row = i * q_len + j
            assert padded.rows[sum(c.q_len for c in cases[:i]) + j] == row
            assert slots[row] == metadata.slot_mapping[int(metadata.query_start_loc[i]) + j]
            visible = meta.seq_lens_host[i] - q_len + j + 1  # causal, bottom-right aligned
            assert padded_history[:visible] == history[: case.history + j + 1]
        own_pages = -(-case.seq_len // block_size)
        pages = layout.kv_indices[layout.kv_indptr[i] : layout.kv_indptr[i + 1]].tolist()
        assert set(pages[own_pages:]) <= {pad_block}
    for row, slot in enumerate(slots):
        if row not in real:
            assert slot // block_size == pad_block
    assert all(s >= q_len for s in meta.seq_lens_host)  # FlashInfer: kv_len >= q_len


def test_pad_uniform_returns_an_already_uniform_batch_as_it_is() -> None:
    rng = random.Random(4)
    metadata, _ = make_metadata(rng, [RequestCase(9, 3), RequestCase(30, 3)], 4, 64)
    padded = pad_uniform(metadata, 2, 3, 63, 4)
    assert padded.metadata is metadata and padded.rows.tolist() == list(range(6))
    again = pad_uniform(metadata, 4, 3, 63, 4)  # a larger batch still pads
    assert again.metadata.num_requests == 4 and again.rows.tolist() == list(range(6))


def test_pad_uniform_refuses_what_it_cannot_pad() -> None:
    _, metadata = random_batch(1, 4, kinds=("verify",))
    longest = max(metadata.query_lens_host)
    with pytest.raises(ValueError, match="cannot pad"):
        pad_uniform(metadata, 64, longest - 1, 0, 4)
    with pytest.raises(ValueError, match="cannot pad"):
        pad_uniform(metadata, metadata.num_requests - 1, longest, 0, 4)
    _, trees = random_batch(2, 4, kinds=("tree",))
    with pytest.raises(ValueError, match="tree masks"):
        pad_uniform(trees, 64, 32, 0, 4)


def test_graph_shapes_pad_to_the_next_captured_batch() -> None:
    shapes = GraphShapes((1, 2, 4, 8, 16, 32, 64), 5)
    assert [shapes.padded(n, 3)[0] for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert shapes.replays([1, 5, 2]) and not shapes.replays([6])
    assert not shapes.replays([1] * 65) and not shapes.replays([1], tree=True)
    assert not GraphShapes().replays([1]) and GraphShapes((1,), 1).eager_on_drafts
    assert len(shapes.all_shapes()) == 7 * 5


def test_registry_picks_reference_on_cpu_without_native_kernels(monkeypatch, caplog) -> None:
    monkeypatch.setattr(registry, "cpu_unavailable_reason", lambda device, dtype: "no compiler")
    with caplog.at_level(logging.INFO, logger="kernels.registry"):
        backend = registry.make_attention_backend("auto", torch.device("cpu"))
    assert backend.name == "reference"
    lines = [r.getMessage() for r in caplog.records if r.name == "kernels.registry"]
    expected = (
        "attention backend: reference (auto: device is cpu, FlashInfer needs CUDA; no compiler)"
    )
    assert lines == [expected]


def test_registry_picks_cpu_backend_for_float32_when_native_kernels_load(caplog) -> None:
    from kernels.cpu import native_available

    if not native_available():
        pytest.skip("native CPU kernels not built here")
    with caplog.at_level(logging.INFO, logger="kernels.registry"):
        assert registry.make_attention_backend("auto", "cpu", torch.float32).name == "cpu"
        assert registry.make_attention_backend("auto", "cpu", torch.bfloat16).name == "reference"
    assert "attention backend: cpu (auto" in caplog.text
    with pytest.raises(ValueError, match="attention_backend=cpu is unavailable: dtype"):
        registry.make_attention_backend("cpu", "cpu", torch.bfloat16)


def test_registry_auto_picks_flashinfer_when_available(monkeypatch, caplog) -> None:
    monkeypatch.setattr(registry, "flashinfer_unavailable_reason", lambda device, dtype: None)
    monkeypatch.setattr(registry, "_flashinfer", lambda device: ("flashinfer", device))
    with caplog.at_level(logging.INFO, logger="kernels.registry"):
        backend = registry.make_attention_backend("auto", "cuda")
    assert backend == ("flashinfer", torch.device("cuda"))
    assert "attention backend: flashinfer" in caplog.text


def test_registry_refuses_flashinfer_where_it_cannot_run() -> None:
    with pytest.raises(ValueError, match="flashinfer is unavailable: device is cpu"):
        registry.make_attention_backend("flashinfer", "cpu")
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        registry.make_attention_backend("triton", "cpu")
    reason = registry.flashinfer_unavailable_reason(torch.device("cpu"), torch.float32)
    assert reason is not None


def test_graph_batch_sizes_cover_max_num_seqs() -> None:
    from kernels.cuda_graphs import graph_batch_sizes

    assert graph_batch_sizes(64) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_batch_sizes(5) == (1, 2, 4, 8)
    assert graph_batch_sizes(1) == (1,)
    assert graph_batch_sizes(500) == (1, 2, 4, 8, 16, 32, 64)  # larger batches run eagerly
