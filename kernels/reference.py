"""Reference attention backend: paged KV cache + masked SDPA in plain PyTorch (CPU and CUDA).

The ground truth every faster backend is compared against. Contract: kernels/attention.py.

Cache addressing. A layer's cache is [num_blocks, 2, block_size, num_kv_heads, head_dim]; viewed
flat as rows [num_blocks * 2 * block_size, num_kv_heads, head_dim], slot s = b * block_size + o
has its K at row b * 2 * block_size + o and its V block_size rows later. `plan` turns slots into
rows once per step, so each layer does one index_copy_ per K/V write and one index_select per
history gather.

Batching. Requests decoding one token without a tree mask ("decodes") are sorted by length and
attended in padded groups, one SDPA per group with a key-padding mask; a group grows while its
gathered K/V stays under GATHER_BUDGET_BYTES. Measured on the 2-core dev machine (SmolLM2
shapes, one thread, 30 layers): 32 decodes of 64 tokens take 27 ms grouped vs 57 ms one by
one, but a single padded gather of 32 x 1024 tokens (50 MB) took 1.3 s vs 0.40 s one by one:
the cost per key token grows once the gather falls out of cache. With a 2 MiB budget the
grouped path matched or beat the loop on every mix tried (2-32 requests, 64-1024 tokens). Every
other request (prefill chunk, verify chain, tree) runs its own SDPA with a causal-with-history
or tree mask built in `plan`.

Sliding windows: `plan` builds one set of groups and chunks per distinct window of the spec's
layers, the window folded into their masks; the gathers still read the whole history (this is
the ground truth, not the fast path).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import host_memory
from kernels.attention import AttentionMetadata, KVCacheSpec

# Largest padded K+V gather of one decode group (see the module docstring for the measurement).
GATHER_BUDGET_BYTES = 2 * 2**20


@dataclass(frozen=True)
class _DecodePlan:
    """A group of single-token requests, attended as one padded batch."""

    query_rows: torch.Tensor  # [num_decodes] int64, rows of q belonging to the group
    kv_rows: torch.Tensor  # [2 * num_decodes * max_seq_len] int64, K rows then V rows
    key_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_seq_len] bool; None: no padding
    max_seq_len: int
    rows_are_all: bool  # query_rows == arange(num_tokens): output needs no scatter


@dataclass(frozen=True)
class _ChunkPlan:
    """One request with several new tokens (prefill chunk, verify chain or tree)."""

    start: int  # first query row
    end: int  # one past the last query row
    kv_rows: torch.Tensor  # [2 * seq_len] int64, K rows then V rows
    mask: torch.Tensor | None  # [q_len, seq_len] bool; None: plain causal with q_len == seq_len


class ReferenceBackend:
    name = "reference"
    reads_window_pool = True  # KVCacheSpec.num_window_blocks: the window layers' own pool

    def __init__(self) -> None:
        self.kv_caches: list[torch.Tensor] = []
        self.spec: KVCacheSpec | None = None
        self.metadata: AttentionMetadata | None = None
        # [2 * num_tokens] K rows then V rows, per pool (True: the window pool)
        self._write_rows: dict[bool, torch.Tensor] = {}
        # window -> (decode groups, chunks) of this step; window 0 = full attention
        self._plans: dict[int, tuple[list[_DecodePlan], list[_ChunkPlan]]] = {}

    def allocate(self, spec: KVCacheSpec) -> None:
        self.spec = spec
        self.kv_caches = [
            host_memory.zeros(
                (spec.blocks_of(layer), 2, spec.block_size, spec.num_kv_heads, spec.head_dim),
                spec.dtype,
                spec.device,
            )
            for layer in range(spec.num_layers)
        ]

    # ----- per-step planning (host work shared by all layers) -----

    def plan(self, metadata: AttentionMetadata) -> None:
        assert self.spec is not None, "allocate() must run before plan()"
        self.metadata = metadata
        self._write_rows = {
            window: self._k_and_v_rows(metadata.of_group(window).slot_mapping.to(torch.int64))
            for window in {self.spec.num_window_blocks > 0, False}
        }
        tree_masks = metadata.tree_masks or (None,) * metadata.num_requests
        starts = [0]
        for q_len in metadata.query_lens_host:
            starts.append(starts[-1] + q_len)
        decode_ids, chunk_ids = [], []
        for i, (q_len, mask) in enumerate(zip(metadata.query_lens_host, tree_masks, strict=True)):
            (decode_ids if q_len == 1 and mask is None else chunk_ids).append(i)
        groups = self._group_decodes(metadata, decode_ids)
        self._plans = {}
        for window in set(self.spec.sliding_windows or (0,)):
            group = metadata.of_group(window > 0)
            self._plans[window] = (
                [self._plan_decodes(group, ids, starts, window) for ids in groups],
                [self._plan_chunk(group, i, starts[i], tree_masks[i], window) for i in chunk_ids],
            )

    def _k_and_v_rows(self, slots: torch.Tensor) -> torch.Tensor:
        """Slots [n] -> flat cache rows [2n]: the K rows, then the V rows."""
        block_size = self.spec.block_size
        k_rows = slots + (slots // block_size) * block_size
        return torch.cat([k_rows, k_rows + block_size])

    def _history_slots(
        self, metadata: AttentionMetadata, ids: list[int], length: int
    ) -> torch.Tensor:
        """Slots of the first `length` history tokens of requests `ids`: [len(ids), length]."""
        block_size = self.spec.block_size
        device = metadata.block_tables.device
        positions = torch.arange(length, device=device)
        tables = metadata.block_tables[ids].to(torch.int64)
        blocks = tables[:, positions // block_size]
        return blocks * block_size + positions % block_size

    def _group_decodes(self, metadata: AttentionMetadata, ids: list[int]) -> list[list[int]]:
        """Longest first; a group grows while its padded gather fits GATHER_BUDGET_BYTES."""
        spec = self.spec
        bytes_per_token = 2 * spec.num_kv_heads * spec.head_dim * spec.dtype.itemsize
        budget_tokens = GATHER_BUDGET_BYTES // bytes_per_token
        seq_lens = metadata.seq_lens_host
        groups: list[list[int]] = []
        for i in sorted(ids, key=lambda i: -seq_lens[i]):  # stable: equal lengths keep order
            if groups and (len(groups[-1]) + 1) * seq_lens[groups[-1][0]] <= budget_tokens:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    def _plan_decodes(
        self, metadata: AttentionMetadata, ids: list[int], starts: list[int], window: int
    ) -> _DecodePlan:
        device = metadata.block_tables.device
        seq_lens = [metadata.seq_lens_host[i] for i in ids]
        max_seq_len = max(seq_lens)
        slots = self._history_slots(metadata, ids, max_seq_len)
        key_mask = None
        if min(seq_lens) != max_seq_len or 0 < window < max_seq_len:
            lens = torch.tensor(seq_lens, device=device)
            key_pos = torch.arange(max_seq_len, device=device)
            key_mask = key_pos < lens[:, None]
            if window:  # the query sits at len - 1 and sees keys after len - 1 - window
                key_mask &= key_pos >= lens[:, None] - window
            key_mask = key_mask[:, None, None, :]
        rows = [starts[i] for i in ids]
        return _DecodePlan(
            query_rows=torch.tensor(rows, dtype=torch.int64, device=device),
            kv_rows=self._k_and_v_rows(slots.reshape(-1)),
            key_mask=key_mask,
            max_seq_len=max_seq_len,
            rows_are_all=rows == list(range(metadata.num_tokens)),
        )

    def _plan_chunk(
        self,
        metadata: AttentionMetadata,
        i: int,
        start: int,
        tree_mask: torch.Tensor | None,
        window: int,
    ) -> _ChunkPlan:
        device = metadata.block_tables.device
        q_len, seq_len = metadata.query_lens_host[i], metadata.seq_lens_host[i]
        slots = self._history_slots(metadata, [i], seq_len)[0]
        num_history = seq_len - q_len
        key_pos = torch.arange(seq_len, device=device)
        # Query j sits at position num_history + j (a tree node: + its depth instead).
        query_pos = torch.arange(num_history, seq_len, device=device)
        mask = None
        if tree_mask is not None:
            tree_mask = tree_mask.to(device=device, dtype=torch.bool)
            visible = torch.ones(q_len, num_history, dtype=torch.bool, device=device)
            mask = torch.cat([visible, tree_mask], dim=1)
            query_pos = num_history + tree_mask.sum(dim=1) - 1
        elif num_history > 0 or 0 < window < seq_len:
            mask = key_pos[None, :] <= query_pos[:, None]
        if mask is not None and window:
            mask = mask & (key_pos[None, :] > query_pos[:, None] - window)
        return _ChunkPlan(start, start + q_len, self._k_and_v_rows(slots), mask)

    # ----- per-layer work -----

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        flat = self._flat_cache(layer)
        rows = self._write_rows[self.spec.in_window_pool(layer)]
        flat.index_copy_(0, rows, torch.cat([k, v]).to(flat.dtype))
        groups, chunks = self._plans[self.spec.window(layer)]
        if len(groups) == 1 and groups[0].rows_are_all:
            return self._attend_decodes(flat, q, groups[0], scale)
        out = torch.empty_like(q)
        for group in groups:
            out.index_copy_(0, group.query_rows, self._attend_decodes(flat, q, group, scale))
        for chunk in chunks:
            out[chunk.start : chunk.end] = self._attend_chunk(flat, q, chunk, scale)
        return out

    def _flat_cache(self, layer: int) -> torch.Tensor:
        cache = self.kv_caches[layer]
        return cache.view(-1, cache.shape[-2], cache.shape[-1])

    def _attend_decodes(
        self, flat: torch.Tensor, q: torch.Tensor, decode: _DecodePlan, scale: float
    ) -> torch.Tensor:
        num_decodes = decode.query_rows.shape[0]
        kv = flat.index_select(0, decode.kv_rows).to(q.dtype)
        # [2, R, S, Hkv, D] -> K, V as [R, Hkv, S, D]
        kv = kv.view(2, num_decodes, decode.max_seq_len, *kv.shape[-2:]).transpose(2, 3)
        query = q if decode.rows_are_all else q.index_select(0, decode.query_rows)
        out = F.scaled_dot_product_attention(
            query.unsqueeze(2),
            kv[0],
            kv[1],
            attn_mask=decode.key_mask,
            scale=scale,
            enable_gqa=True,
        )
        return out.squeeze(2)

    def _attend_chunk(
        self, flat: torch.Tensor, q: torch.Tensor, chunk: _ChunkPlan, scale: float
    ) -> torch.Tensor:
        kv = flat.index_select(0, chunk.kv_rows).to(q.dtype)
        kv = kv.view(2, -1, *kv.shape[-2:]).transpose(1, 2)  # [2, Hkv, S, D]
        query = q[chunk.start : chunk.end].transpose(0, 1)  # [H, q_len, D]
        out = F.scaled_dot_product_attention(
            query.unsqueeze(0),
            kv[0].unsqueeze(0),
            kv[1].unsqueeze(0),
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        return out[0].transpose(0, 1)

    def copy_slots(
        self, src_slots: torch.Tensor, dst_slots: torch.Tensor, window: bool = False
    ) -> None:
        src_rows = self._k_and_v_rows(src_slots.to(torch.int64))
        dst_rows = self._k_and_v_rows(dst_slots.to(torch.int64))
        for layer in self.spec.pool_layers(window):
            flat = self._flat_cache(layer)
            # index_select copies first, so overlapping src/dst sets read the old values.
            flat.index_copy_(0, dst_rows, flat.index_select(0, src_rows))
