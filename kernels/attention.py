"""Attention backend contract: paged KV cache + attention over a flattened ragged batch.

A step's batch is `num_tokens` query tokens from `num_requests` requests laid end to end
(no padding). Request i owns query rows [query_start_loc[i], query_start_loc[i+1]); its K/V
history is seq_lens[i] tokens long *including* this step's new tokens, stored in the blocks
listed in block_tables[i]. The new tokens sit at the end of that history.

KV cache layout (shared by every backend, FlashInfer's paged "NHD" layout):
    one tensor per layer, [num_blocks, 2, block_size, num_kv_heads, head_dim]; [:, 0] = K, [:, 1] = V.
    slot = block_id * block_size + offset.

Masks: by default the new tokens attend causally among themselves and to the whole history.
A request may instead carry a tree mask [q_len, q_len] (bool, True = may attend) over its new
tokens; the history before them is always fully visible. Speculative trees use this.
A layer with a sliding window W (KVCacheSpec.sliding_windows) further hides the keys more than
W - 1 positions before the query (transformers' `kv > q - W`); a tree node's position is the
history length plus its depth.

Window pool: with KVCacheSpec.num_window_blocks > 0 the sliding-window layers' caches have that
many blocks of their own, addressed by the metadata's window_block_tables and
window_slot_mapping (the engine releases blocks that slid out of every query's window, so their
table entries before the window are placeholders that no kernel reads).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    query_start_loc: torch.Tensor  # [num_requests + 1] int32, cu_query_lens
    seq_lens: torch.Tensor  # [num_requests] int32, history length incl. new tokens
    block_tables: torch.Tensor  # [num_requests, max_blocks_per_request] int32, 0-padded
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot of each new token
    query_lens_host: tuple[int, ...]  # same as diff(query_start_loc), on the host
    seq_lens_host: tuple[int, ...]  # same as seq_lens, on the host
    tree_masks: tuple[torch.Tensor | None, ...] = ()  # per request [q_len, q_len] bool, or None
    # The window pool's tables and slots (KVCacheSpec.num_window_blocks > 0), else None.
    window_block_tables: torch.Tensor | None = None
    window_slot_mapping: torch.Tensor | None = None

    def of_group(self, window: bool) -> AttentionMetadata:
        """The metadata a layer reads: the window pool's tables and slots for a sliding layer
        when the cache has a window pool."""
        if not window or self.window_block_tables is None:
            return self
        return replace(
            self,
            block_tables=self.window_block_tables,
            slot_mapping=self.window_slot_mapping,
            window_block_tables=None,
            window_slot_mapping=None,
        )

    @property
    def num_requests(self) -> int:
        return len(self.seq_lens_host)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens_host)

    @property
    def is_pure_decode(self) -> bool:
        return all(q == 1 for q in self.query_lens_host) and not any(
            m is not None for m in self.tree_masks
        )


@dataclass(frozen=True)
class KVCacheSpec:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    sliding_windows: tuple[int, ...] = ()  # per layer, 0 = full attention; () = all full
    num_window_blocks: int = 0  # the sliding layers' own pool; 0: they use the num_blocks pool

    def window(self, layer: int) -> int:
        return self.sliding_windows[layer] if self.sliding_windows else 0

    def in_window_pool(self, layer: int) -> bool:
        return self.num_window_blocks > 0 and self.window(layer) > 0

    def pool_layers(self, window: bool) -> list[int]:
        """The layers whose caches one pool's block ids address (copy_slots' `window`)."""
        return [i for i in range(self.num_layers) if self.in_window_pool(i) == window]

    def blocks_of(self, layer: int) -> int:
        """The number of blocks in the layer's cache."""
        return self.num_window_blocks if self.in_window_pool(layer) else self.num_blocks

    @property
    def bytes_per_block(self) -> int:
        return (
            2
            * self.num_layers
            * self.block_size
            * self.num_kv_heads
            * self.head_dim
            * self.dtype.itemsize
        )


class AttentionBackend(Protocol):
    """Implementations: kernels.reference.ReferenceBackend, kernels.flashinfer_backend."""

    name: str

    def allocate(self, spec: KVCacheSpec) -> None:
        """Create the paged cache (one tensor per layer, zero-filled)."""

    def plan(self, metadata: AttentionMetadata) -> None:
        """Called once per step before the layers run; may precompute indices/masks."""

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """Write k, v into the cache at metadata.slot_mapping, then attend.

        q: [num_tokens, num_heads, head_dim]; k, v: [num_tokens, num_kv_heads, head_dim]
        returns [num_tokens, num_heads, head_dim]. GQA: query head h uses KV head h // group.
        """

    def copy_slots(
        self, src_slots: torch.Tensor, dst_slots: torch.Tensor, window: bool = False
    ) -> None:
        """Copy K/V of cache slots src -> dst (CoW blocks, tree compaction) in every layer of
        one pool: the window pool's layers when `window`, else the others (all layers when the
        cache has no window pool)."""
