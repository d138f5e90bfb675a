"""FlashInfer's view of one step's batch: CSR page lists, flattened masks, cache row indices.

Pure index construction (torch tensors, no flashinfer import) so that the CPU test suite can
check it against the reference backend's view of the same batch. FlashInfer's paged format:

    qo_indptr [B+1]        = query_start_loc: request i owns query rows [qo_indptr[i], qo_indptr[i+1])
    kv_indptr [B+1]        request i's pages are kv_indices[kv_indptr[i] : kv_indptr[i+1]]
    kv_indices [nnz_pages] page ids (= our block ids) in history order
    kv_last_page_len [B]   tokens used in request i's last page, in 1..page_size

Invariant: (num_pages_i - 1) * page_size + kv_last_page_len[i] == seq_lens[i], i.e. the pages
hold exactly the history the reference backend gathers (new tokens included, at the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from kernels.attention import AttentionMetadata


@dataclass(frozen=True)
class PagedKVLayout:
    """CSR page metadata for one step. Host tensors are what FlashInfer's plan() reads."""

    qo_indptr: torch.Tensor  # [num_requests + 1] int32, host
    kv_indptr: torch.Tensor  # [num_requests + 1] int32, host
    kv_indices: torch.Tensor  # [kv_indptr[-1]] int32, on the block tables' device
    kv_last_page_len: torch.Tensor  # [num_requests] int32, host


def num_pages(seq_len: int, page_size: int) -> int:
    """Pages needed to hold seq_len tokens."""
    return -(-seq_len // page_size)


def last_page_len(seq_len: int, page_size: int) -> int:
    """Tokens in the last page: 1..page_size for any seq_len >= 1 (a full page counts as full)."""
    return (seq_len - 1) % page_size + 1


def _check_batch(metadata: AttentionMetadata, page_size: int) -> list[int]:
    """Validate lengths against the block tables; return the page count per request."""
    width = metadata.block_tables.shape[1] if metadata.block_tables.dim() == 2 else 0
    pages = []
    for i, (q_len, seq_len) in enumerate(
        zip(metadata.query_lens_host, metadata.seq_lens_host, strict=True)
    ):
        if not 1 <= q_len <= seq_len:
            raise ValueError(f"request {i}: need 1 <= query_len ({q_len}) <= seq_len ({seq_len})")
        pages.append(num_pages(seq_len, page_size))
        if pages[-1] > width:
            raise ValueError(
                f"request {i}: seq_len {seq_len} needs {pages[-1]} blocks of {page_size}, "
                f"block table has {width}"
            )
    return pages


def build_paged_kv_layout(metadata: AttentionMetadata, page_size: int) -> PagedKVLayout:
    """CSR page lists from the block tables and host lengths, without a host sync.

    kv_indices is gathered on the block tables' device with an index built on the host: entry
    j of request i is block_tables[i, j] for j < num_pages_i (the 0-padding is never read).
    """
    pages = _check_batch(metadata, page_size)
    num_requests = len(pages)
    pages_t = torch.tensor(pages, dtype=torch.int64)
    kv_indptr = torch.zeros(num_requests + 1, dtype=torch.int64)
    kv_indptr[1:] = torch.cumsum(pages_t, 0)
    total = int(kv_indptr[-1])
    rows = torch.repeat_interleave(torch.arange(num_requests), pages_t)
    cols = torch.arange(total) - torch.repeat_interleave(kv_indptr[:-1], pages_t)
    width = metadata.block_tables.shape[1] if num_requests else 0
    flat_index = (rows * width + cols).to(metadata.block_tables.device, non_blocking=True)
    kv_indices = metadata.block_tables.reshape(-1)[flat_index].to(torch.int32)
    qo_indptr = torch.zeros(num_requests + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(torch.tensor(metadata.query_lens_host, dtype=torch.int32), 0)
    last = [last_page_len(s, page_size) for s in metadata.seq_lens_host]
    return PagedKVLayout(
        qo_indptr=qo_indptr,
        kv_indptr=kv_indptr.to(torch.int32),
        kv_indices=kv_indices,
        kv_last_page_len=torch.tensor(last, dtype=torch.int32),
    )


def has_tree_masks(metadata: AttentionMetadata) -> bool:
    return any(mask is not None for mask in metadata.tree_masks)


def request_mask(q_len: int, seq_len: int, tree_mask: torch.Tensor | None) -> torch.Tensor:
    """[q_len, seq_len] bool for one request: history columns all True, then the new tokens'
    block — the tree mask if given, else causal (row r sees new tokens 0..r)."""
    mask = torch.ones(q_len, seq_len, dtype=torch.bool)
    if tree_mask is not None:
        if tuple(tree_mask.shape) != (q_len, q_len):
            raise ValueError(f"tree mask shape {tuple(tree_mask.shape)} != ({q_len}, {q_len})")
        mask[:, seq_len - q_len :] = tree_mask.to(device="cpu", dtype=torch.bool)
    else:
        mask[:, seq_len - q_len :] = torch.ones(q_len, q_len, dtype=torch.bool).tril()
    return mask


def build_custom_mask(metadata: AttentionMetadata) -> torch.Tensor:
    """Flattened bool mask for FlashInfer's prefill `custom_mask` (host tensor).

    Request i contributes its [q_len_i, seq_len_i] mask row-major, requests back to back, so
    request i starts at sum_{j<i} q_len_j * seq_len_j (FlashInfer's mask_indptr).
    """
    masks = metadata.tree_masks
    parts = [
        request_mask(q_len, seq_len, masks[i] if i < len(masks) else None).reshape(-1)
        for i, (q_len, seq_len) in enumerate(
            zip(metadata.query_lens_host, metadata.seq_lens_host, strict=True)
        )
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.bool)


def kv_cache_rows(slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """[2, n] int64: rows of the cache viewed as [num_blocks * 2 * block_size, H_kv, D].

    Layer cache [num_blocks, 2, block_size, H_kv, D] flattens to rows in the order
    (block, k|v, offset), so slot b * block_size + o has its K at b * 2 * block_size + o and
    its V one block_size further. Row 0 = K rows, row 1 = V rows.
    """
    slots = slots.to(torch.int64)
    blocks = torch.div(slots, block_size, rounding_mode="floor")
    k_rows = blocks * block_size + slots  # = blocks * 2 * block_size + offset
    return torch.stack([k_rows, k_rows + block_size])


def pad_decode_metadata(
    metadata: AttentionMetadata, batch_size: int, pad_block_id: int, block_size: int
) -> AttentionMetadata:
    """A pure-decode batch padded with dummy requests up to batch_size (for CUDA graphs).

    Each dummy request has one token at slot pad_block_id * block_size, history length 1 and
    the block table row [pad_block_id, 0, ...]: it reads and writes only the pad block, which
    no real request owns, so real requests' outputs and cache are unaffected.
    """
    num_pad = batch_size - metadata.num_requests
    if not metadata.is_pure_decode or num_pad < 0:
        raise ValueError(
            f"can pad only a pure-decode batch of <= {batch_size} requests, "
            f"got {metadata.num_requests} requests with query lengths {metadata.query_lens_host}"
        )
    if num_pad == 0:
        return metadata
    device = metadata.block_tables.device
    width = max(1, metadata.block_tables.shape[1])
    pad_tables = torch.zeros(num_pad, width, dtype=metadata.block_tables.dtype, device=device)
    pad_tables[:, 0] = pad_block_id
    tables = torch.zeros(metadata.num_requests, width, dtype=pad_tables.dtype, device=device)
    tables[:, : metadata.block_tables.shape[1]] = metadata.block_tables
    pad_slots = torch.full((num_pad,), pad_block_id * block_size, dtype=torch.int64)
    start = torch.arange(1, num_pad + 1, dtype=metadata.query_start_loc.dtype)
    return replace(
        metadata,
        query_start_loc=torch.cat(
            [metadata.query_start_loc, (start + metadata.num_tokens).to(device)]
        ),
        seq_lens=torch.cat([metadata.seq_lens, torch.ones_like(start).to(device)]),
        block_tables=torch.cat([tables, pad_tables]),
        slot_mapping=torch.cat([metadata.slot_mapping, pad_slots.to(device)]),
        query_lens_host=metadata.query_lens_host + (1,) * num_pad,
        seq_lens_host=metadata.seq_lens_host + (1,) * num_pad,
        tree_masks=(),
    )


def padded_batch_size(num_requests: int, batch_sizes: Sequence[int]) -> int | None:
    """Smallest captured batch size >= num_requests, or None when the batch is too large."""
    fitting = [size for size in batch_sizes if size >= num_requests]
    return min(fitting) if fitting else None
