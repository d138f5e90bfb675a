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

from dataclasses import dataclass

import numpy as np
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


def _check_batch(metadata: AttentionMetadata, page_size: int) -> np.ndarray:
    """Validate lengths against the block tables; return the page count per request."""
    width = metadata.block_tables.shape[1] if metadata.block_tables.dim() == 2 else 0
    q_lens = np.asarray(metadata.query_lens_host, dtype=np.int64)
    seq_lens = np.asarray(metadata.seq_lens_host, dtype=np.int64)
    if len(q_lens) != len(seq_lens):
        raise ValueError(f"{len(q_lens)} query lengths for {len(seq_lens)} sequence lengths")
    pages = -(-seq_lens // page_size)
    bad = np.flatnonzero((q_lens < 1) | (q_lens > seq_lens) | (pages > width))
    if len(bad):
        i = int(bad[0])
        q_len, seq_len = int(q_lens[i]), int(seq_lens[i])
        if not 1 <= q_len <= seq_len:
            raise ValueError(f"request {i}: need 1 <= query_len ({q_len}) <= seq_len ({seq_len})")
        raise ValueError(
            f"request {i}: seq_len {seq_len} needs {int(pages[i])} blocks of {page_size}, "
            f"block table has {width}"
        )
    return pages


def build_paged_kv_layout(metadata: AttentionMetadata, page_size: int) -> PagedKVLayout:
    """CSR page lists from the block tables and host lengths, without a host sync.

    Host tables (a CUDA-graph step plans from the host) are gathered with numpy; device tables
    on their device with an index built on the host. Either way entry j of request i is
    block_tables[i, j] for j < num_pages_i (the 0-padding is never read).
    """
    pages = _check_batch(metadata, page_size)
    kv_indptr = np.zeros(len(pages) + 1, dtype=np.int32)
    np.cumsum(pages, out=kv_indptr[1:])
    tables = metadata.block_tables
    if tables.device.type == "cpu":
        width = tables.shape[1] if tables.dim() == 2 else 0
        used = np.arange(width)[None, :] < pages[:, None]
        kv_indices = torch.from_numpy(tables.numpy()[used].astype(np.int32, copy=False))
    else:
        kv_indices = _gather_pages(tables, pages, kv_indptr)
    qo_indptr = np.zeros(len(pages) + 1, dtype=np.int32)
    np.cumsum(metadata.query_lens_host, out=qo_indptr[1:])
    seq_lens = np.asarray(metadata.seq_lens_host, dtype=np.int32)
    return PagedKVLayout(
        qo_indptr=torch.from_numpy(qo_indptr),
        kv_indptr=torch.from_numpy(kv_indptr),
        kv_indices=kv_indices,
        kv_last_page_len=torch.from_numpy((seq_lens - 1) % page_size + 1),
    )


def _gather_pages(tables: torch.Tensor, pages: np.ndarray, kv_indptr: np.ndarray) -> torch.Tensor:
    """kv_indices gathered on the tables' device (int32)."""
    rows = np.repeat(np.arange(len(pages)), pages)
    cols = np.arange(int(kv_indptr[-1])) - np.repeat(kv_indptr[:-1], pages)
    width = tables.shape[1] if len(pages) else 0
    flat_index = torch.from_numpy(rows * width + cols).to(tables.device, non_blocking=True)
    return tables.reshape(-1)[flat_index].to(torch.int32)


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


@dataclass(frozen=True)
class UniformBatch:
    """A step padded to a captured CUDA-graph shape: batch_size requests of query_len rows.

    Request i's real rows become padded rows i * query_len + j; the rows after them are
    dummies. A dummy row of request i stands where its next tokens would, so its causal view
    ends past the request's history: the request's declared length grows by its dummy rows,
    which read stale cache entries (or the pad block, past its last page) and write only the
    pad block. The real rows see exactly their own history (query row r of a query_len-row
    request sees kv positions < seq_len - query_len + r + 1). Dummy requests past the real
    ones own only the pad block. No real row ever reads a pad-block entry.
    """

    metadata: AttentionMetadata  # host tensors, every request query_len rows, no tree masks
    rows: np.ndarray  # [num real rows] int64: the padded row of each real row, in order
    query_len: int

    @property
    def num_rows(self) -> int:
        return self.metadata.num_tokens


def pad_uniform(
    metadata: AttentionMetadata,
    batch_size: int,
    query_len: int,
    pad_block_id: int,
    block_size: int,
) -> UniformBatch:
    """Pad a host batch (no tree masks, <= batch_size requests, <= query_len rows each) to
    batch_size requests of query_len rows (UniformBatch). A batch already of that shape (every
    batch-1 step, a full batch of equal chains) is returned as it is."""
    lens = metadata.query_lens_host
    uniform = len(lens) == batch_size and all(q == query_len for q in lens)
    if uniform and not any(m is not None for m in metadata.tree_masks):
        return UniformBatch(metadata, np.arange(batch_size * query_len), query_len)
    query_lens = np.asarray(lens, dtype=np.int64)
    n = len(query_lens)
    if metadata.tree_masks and any(m is not None for m in metadata.tree_masks):
        raise ValueError("a batch with tree masks has no uniform padding")
    if n > batch_size or (n and int(query_lens.max()) > query_len):
        raise ValueError(
            f"cannot pad {n} requests of up to {int(query_lens.max(initial=0))} rows to "
            f"{batch_size} x {query_len}"
        )
    seq_lens = np.full(batch_size, query_len, dtype=np.int64)
    seq_lens[:n] = np.asarray(metadata.seq_lens_host, dtype=np.int64) + query_len - query_lens
    rows = _real_rows(query_lens, query_len)
    slots = pad_block_id * block_size + np.arange(batch_size * query_len) % block_size
    slots[rows] = metadata.slot_mapping.numpy()
    padded = AttentionMetadata(
        query_start_loc=torch.arange(0, (batch_size + 1) * query_len, query_len, dtype=torch.int32),
        seq_lens=torch.from_numpy(seq_lens.astype(np.int32)),
        block_tables=torch.from_numpy(
            _padded_tables(metadata, seq_lens, batch_size, pad_block_id, block_size)
        ),
        slot_mapping=torch.from_numpy(slots),
        query_lens_host=(query_len,) * batch_size,
        seq_lens_host=tuple(seq_lens.tolist()),
    )
    return UniformBatch(padded, rows, query_len)


def _real_rows(query_lens: np.ndarray, query_len: int) -> np.ndarray:
    """Padded row of each real row: request i's j-th row -> i * query_len + j."""
    starts = np.repeat(np.arange(len(query_lens)) * query_len, query_lens)
    firsts = np.repeat(np.cumsum(query_lens) - query_lens, query_lens)
    return starts + np.arange(int(query_lens.sum())) - firsts


def _padded_tables(
    metadata: AttentionMetadata,
    seq_lens: np.ndarray,
    batch_size: int,
    pad_block_id: int,
    block_size: int,
) -> np.ndarray:
    """Block tables of the padded batch: each real request's own pages, then the pad block
    for pages its dummy rows reach past them; dummy requests only the pad block."""
    own = -(-np.asarray(metadata.seq_lens_host, dtype=np.int64) // block_size)
    needed = -(-seq_lens // block_size)
    width = max(int(needed.max(initial=1)), 1)
    tables = np.full((batch_size, width), pad_block_id, dtype=np.int32)
    source = metadata.block_tables.numpy()
    cols = min(source.shape[1], width)
    used = np.arange(cols)[None, :] < own[:, None]
    tables[: len(own), :cols][used] = source[:, :cols][used]
    return tables
