"""FlashInferBackend: the AttentionBackend on CUDA, FlashInfer's paged kernels behind our Protocol.

One step: plan(metadata) builds the CSR page lists (kernels.flashinfer_metadata) and plans one
wrapper — the batch decode wrapper for pure-decode steps, else the batch prefill wrapper (causal,
or with a flattened boolean custom mask when any request carries a tree mask). forward() writes
the new K/V by slot into the paged cache (index_copy_ on the flattened cache view) and runs the
planned wrapper; the same plan serves every layer.

FlashInfer's plan() needs the number of query heads and the softmax scale, which the Protocol
only reveals in forward(). They are learned from the first forward() (or given up front with
set_attention_shape(), which CUDA-graph capture needs); until then the wrapper plan is deferred
to the first layer's forward().

A CUDA-graph step (kernels/cuda_graphs.py) plans with plan_graph() instead: its batch is padded
to a captured (batch size, query rows per request) and runs that shape's graph wrapper. The
cache holds one extra block past spec.num_blocks (pad_block_id): the padding's dummy rows write
only there. FlashInfer kernels need float16/bfloat16.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import ModuleType

import torch

from kernels.attention import AttentionMetadata, KVCacheSpec
from kernels.flashinfer_metadata import (
    build_custom_mask,
    build_paged_kv_layout,
    has_tree_masks,
    kv_cache_rows,
)

WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended float workspace (split-k partials)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16)


def import_flashinfer() -> ModuleType:
    import flashinfer

    return flashinfer


class FlashInferBackend:
    name = "flashinfer"

    def __init__(self, device: torch.device | str, flashinfer_module: ModuleType | None = None):
        # flashinfer_module: tests inject a torch emulation of the two wrappers on CPU.
        self.device = torch.device(device)
        self._fi = flashinfer_module if flashinfer_module is not None else import_flashinfer()
        self.kv_caches: list[torch.Tensor] = []
        self._spec: KVCacheSpec | None = None
        self._num_heads: int | None = None
        self._sm_scale: float | None = None
        self._graph_wrappers: dict[tuple[int, int], object] = {}  # (batch, q rows) -> wrapper
        self._pending: tuple[object, tuple, dict] | None = None  # wrapper, plan args not yet run
        self._active: object | None = None
        self._kv_rows = torch.zeros(2, 0, dtype=torch.int64)

    # ---- set-up -----------------------------------------------------------------------
    def allocate(self, spec: KVCacheSpec) -> None:
        if any(spec.sliding_windows):
            raise ValueError(
                "the FlashInfer backend does not run sliding-window layers yet (Mistral, Phi-3, "
                "Gemma 3); use --attention-backend reference"
            )
        if spec.device.type == "cuda" and spec.dtype not in SUPPORTED_DTYPES:
            raise ValueError(
                f"FlashInfer attention needs dtype float16 or bfloat16, got {spec.dtype}; "
                "use --dtype bfloat16 or --attention-backend reference"
            )
        self._spec = spec
        shape = (spec.num_blocks + 1, 2, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self.kv_caches = [
            torch.zeros(shape, dtype=spec.dtype, device=spec.device) for _ in range(spec.num_layers)
        ]
        self._workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=spec.device)
        self._decode = self._fi.BatchDecodeWithPagedKVCacheWrapper(
            self._workspace, "NHD", use_tensor_cores=True
        )
        self._prefill = self._fi.BatchPrefillWithPagedKVCacheWrapper(
            self._workspace, "NHD", backend="fa2"
        )

    @property
    def pad_block_id(self) -> int:
        """The cache block reserved for padded (dummy) requests; no real request owns it."""
        return self._require_spec().num_blocks

    def set_attention_shape(self, num_heads: int, sm_scale: float | None = None) -> None:
        """Fix the query head count and softmax scale so plan() can plan wrappers at once."""
        spec = self._require_spec()
        if num_heads % spec.num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of {spec.num_kv_heads}")
        self._num_heads = num_heads
        self._sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(spec.head_dim)

    def enable_graphs(self, shapes: Sequence[tuple[int, int]], max_pages: int) -> None:
        """One CUDA-graph wrapper per captured (batch size, query rows per request), with
        fixed index buffers: FlashInfer's tensor-core decode with q_len_per_req rows per
        request, causal within each request (a decode at 1 row, a chain verification at 1 + k).

        max_pages: the most pages one request may list (plan_graph's padded batches included).
        """
        device = self._require_spec().device
        for batch, q_len in shapes:
            self._graph_wrappers[(batch, q_len)] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.zeros(batch + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(
                    batch * max_pages, dtype=torch.int32, device=device
                ),
                paged_kv_last_page_len_buffer=torch.zeros(batch, dtype=torch.int32, device=device),
            )

    # ---- per step ---------------------------------------------------------------------
    def plan(self, metadata: AttentionMetadata) -> None:
        """An eager step: the batch decode wrapper for pure decodes, else batch prefill."""
        spec = self._require_spec()
        layout = build_paged_kv_layout(metadata, spec.block_size)
        self._kv_rows = kv_cache_rows(metadata.slot_mapping, spec.block_size).to(spec.device)
        if metadata.is_pure_decode:
            wrapper = self._decode
            args = (layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
            kwargs = dict(self._common(), head_dim=spec.head_dim)
        else:
            wrapper = self._prefill
            mask = None
            if has_tree_masks(metadata):
                mask = build_custom_mask(metadata).to(spec.device, non_blocking=True)
            args = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
            kwargs = dict(
                self._common(), head_dim_qk=spec.head_dim, custom_mask=mask, causal=mask is None
            )
        self._set_plan(wrapper, args, kwargs)

    def plan_graph(self, metadata: AttentionMetadata, kv_rows: torch.Tensor) -> None:
        """A step padded to a captured shape (flashinfer_metadata.pad_uniform: host tensors,
        every request the same query rows), on its graph wrapper. kv_rows: [2, num_tokens]
        int64, the new tokens' K and V cache rows, already in the graph's static device buffer
        (the same tensor at capture and at every replay)."""
        spec = self._require_spec()
        q_len = metadata.query_lens_host[0]
        wrapper = self._graph_wrappers[(metadata.num_requests, q_len)]
        layout = build_paged_kv_layout(metadata, spec.block_size)
        self._kv_rows = kv_rows
        args = (layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
        self._set_plan(
            wrapper, args, dict(self._common(), head_dim=spec.head_dim, q_len_per_req=q_len)
        )

    def _common(self) -> dict:
        spec = self._require_spec()
        return dict(
            num_kv_heads=spec.num_kv_heads,
            page_size=spec.block_size,
            pos_encoding_mode="NONE",  # RoPE is applied by the model with explicit positions
            q_data_type=spec.dtype,
            kv_data_type=spec.dtype,
        )

    def _set_plan(self, wrapper, args: tuple, kwargs: dict) -> None:
        self._active = wrapper
        self._pending = (wrapper, args, kwargs)
        if self._num_heads is not None:
            self._plan_pending()

    def _plan_pending(self) -> None:
        wrapper, args, kwargs = self._pending
        self._pending = None
        wrapper.plan(*args, num_qo_heads=self._num_heads, sm_scale=self._sm_scale, **kwargs)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
    ) -> torch.Tensor:
        if self._num_heads is None:
            self.set_attention_shape(q.shape[1], scale)
        if self._pending is not None:
            self._plan_pending()
        if not math.isclose(scale, self._sm_scale, rel_tol=1e-6):
            raise ValueError(
                f"softmax scale {scale} differs from the planned {self._sm_scale}; "
                "call set_attention_shape(num_heads, scale) before plan()"
            )
        cache = self.kv_caches[layer]
        flat = cache.view(-1, cache.shape[-2], cache.shape[-1])
        flat.index_copy_(0, self._kv_rows[0], k.to(cache.dtype))
        flat.index_copy_(0, self._kv_rows[1], v.to(cache.dtype))
        return self._active.run(q.contiguous(), cache)

    def copy_slots(
        self, src_slots: torch.Tensor, dst_slots: torch.Tensor, window: bool = False
    ) -> None:
        # No window pool here (allocate refuses sliding windows): every layer is one pool.
        # Gather-then-scatter: every read sees the cache before this copy, so overlapping
        # src/dst (tree compaction moving a path down onto earlier nodes) is safe.
        block_size = self._require_spec().block_size
        src = kv_cache_rows(src_slots, block_size).reshape(-1)
        dst = kv_cache_rows(dst_slots, block_size).reshape(-1)
        for cache in self.kv_caches:
            flat = cache.view(-1, cache.shape[-2], cache.shape[-1])
            flat[dst] = flat[src]

    def _require_spec(self) -> KVCacheSpec:
        if self._spec is None:
            raise RuntimeError("FlashInferBackend.allocate(spec) must be called first")
        return self._spec
