"""CPU paged attention backend: native kernels that read the paged KV cache in place.

Same cache layout and contract as the reference backend (kernels/attention.py), which it
extends for allocation and slot copies. Per step `plan` builds three small tensors on the
host: for every query token its request, the request's history length before this step's
tokens, the token's index among them and their number; tree masks become one uint8 row per
token (chains and prefill chunks need none: query j sees new tokens 0..j). Per layer one
native call writes k/v into the cache and attends every (token, KV head) pair in parallel,
keys in position order, so a token's output is the same whichever step (decode, verify
chain, prefill chunk) computes it and whatever else is in the batch. A layer with a sliding
window (spec.sliding_windows) reads only the keys inside it, through the window pool's tables
where the cache has one.

Measured against the reference backend's gather + SDPA in docs/benchmarks.md §5c.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.attention import AttentionMetadata
from kernels.cpu.build import load_native
from kernels.reference import ReferenceBackend


class PlannedBatch(NamedTuple):
    """What `plan` built for the native ops (csrc/decode_core.h AttentionBatch)."""

    slots: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [R, max_blocks] int32
    tokens: torch.Tensor  # [T, 4] int32: request, history, index among new, number of new
    mask: torch.Tensor | None  # [T, max_q_len] uint8 tree-mask rows, or None
    window_slots: torch.Tensor | None = None  # the window pool's slots and tables, or None
    window_block_tables: torch.Tensor | None = None


class CpuPagedBackend(ReferenceBackend):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self._ops = load_native()
        if self._ops is None:
            raise RuntimeError("the native CPU kernels are not available")
        self._tokens: torch.Tensor | None = None  # [T, 4] int32
        self._mask: torch.Tensor | None = None  # [T, max_q_len] uint8, or None
        # slots [T] int64 and block tables [R, max_blocks] int32 per pool (True: the window's)
        self._slots: dict[bool, torch.Tensor] = {}
        self._tables: dict[bool, torch.Tensor] = {}

    def plan(self, metadata: AttentionMetadata) -> None:
        assert self.spec is not None, "allocate() must run before plan()"
        self.metadata = metadata
        rows = []
        for request, (q_len, seq_len) in enumerate(
            zip(metadata.query_lens_host, metadata.seq_lens_host, strict=True)
        ):
            history = seq_len - q_len
            rows.extend((request, history, j, q_len) for j in range(q_len))
        self._tokens = torch.tensor(rows, dtype=torch.int32).reshape(-1, 4)
        self._mask = self._tree_rows(metadata)
        for window in {self.spec.num_window_blocks > 0, False}:
            group = metadata.of_group(window)
            self._slots[window] = group.slot_mapping.to(torch.int64).contiguous()
            self._tables[window] = group.block_tables.to(torch.int32).contiguous()

    def planned(self) -> PlannedBatch:
        assert self._tokens is not None, "plan() must run first"
        return PlannedBatch(
            self._slots[False],
            self._tables[False],
            self._tokens,
            self._mask,
            self._slots.get(True),
            self._tables.get(True),
        )

    @staticmethod
    def _tree_rows(metadata: AttentionMetadata) -> torch.Tensor | None:
        """Token t's row of its request's tree mask (causal rows for requests without one)."""
        masks = metadata.tree_masks
        if not any(m is not None for m in masks):
            return None
        width = max(metadata.query_lens_host)
        out = torch.zeros(metadata.num_tokens, width, dtype=torch.uint8)
        start = 0
        for q_len, mask in zip(metadata.query_lens_host, masks, strict=True):
            if mask is None:
                mask = torch.ones(q_len, q_len, dtype=torch.bool).tril()
            out[start : start + q_len, :q_len] = mask.to(torch.uint8)
            start += q_len
        return out

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        out = torch.empty(q.shape, dtype=torch.float32)
        pool = self.spec.in_window_pool(layer)
        self._ops.paged_attention_out(
            q,
            k,
            v,
            self.kv_caches[layer],
            self._slots[pool],
            self._tables[pool],
            self._tokens,
            self._mask,
            scale,
            out,
            self.spec.window(layer),
        )
        return out
