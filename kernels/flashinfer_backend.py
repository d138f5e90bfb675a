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

The cache holds one extra block past spec.num_blocks (pad_block_id): padded dummy requests of a
CUDA-graph decode batch read and write only there. FlashInfer kernels need float16/bfloat16.
"""

from __future__ import annotations

import math
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
        self._graph_decode: dict[int, object] = {}  # batch size -> CUDA-graph decode wrapper
        self._graph_rows: torch.Tensor | None = None  # [2, max graph batch] static K/V rows
        self._pending: tuple[object, tuple, dict] | None = None  # wrapper, plan args not yet run
        self._active: object | None = None
        self._kv_rows = torch.zeros(2, 0, dtype=torch.int64)

    # ---- set-up -----------------------------------------------------------------------
    def allocate(self, spec: KVCacheSpec) -> None:
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

    def enable_decode_graphs(self, batch_sizes: tuple[int, ...], max_pages: int) -> None:
        """Create one CUDA-graph decode wrapper per batch size, with fixed index buffers.

        max_pages: the most pages one request may use (max_model_len / block_size). Steps whose
        batch size is in batch_sizes then use these wrappers (eagerly or replayed).
        """
        device = self._require_spec().device
        for size in batch_sizes:
            self._graph_decode[size] = self._fi.BatchDecodeWithPagedKVCacheWrapper(
                self._workspace,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=torch.zeros(size + 1, dtype=torch.int32, device=device),
                paged_kv_indices_buffer=torch.zeros(
                    size * max_pages, dtype=torch.int32, device=device
                ),
                paged_kv_last_page_len_buffer=torch.zeros(size, dtype=torch.int32, device=device),
            )
        self._graph_rows = torch.zeros(2, max(batch_sizes), dtype=torch.int64, device=device)

    # ---- per step ---------------------------------------------------------------------
    def plan(self, metadata: AttentionMetadata) -> None:
        spec = self._require_spec()
        layout = build_paged_kv_layout(metadata, spec.block_size)
        self._kv_rows = self._rows_for(metadata)
        common = dict(
            num_kv_heads=spec.num_kv_heads,
            page_size=spec.block_size,
            pos_encoding_mode="NONE",  # RoPE is applied by the model with explicit positions
            q_data_type=spec.dtype,
            kv_data_type=spec.dtype,
        )
        if metadata.is_pure_decode:
            wrapper = self._graph_decode.get(metadata.num_requests, self._decode)
            args = (layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
            kwargs = dict(common, head_dim=spec.head_dim)
        else:
            wrapper = self._prefill
            mask = None
            if has_tree_masks(metadata):
                mask = build_custom_mask(metadata).to(spec.device, non_blocking=True)
            args = (layout.qo_indptr, layout.kv_indptr, layout.kv_indices, layout.kv_last_page_len)
            kwargs = dict(common, head_dim_qk=spec.head_dim, custom_mask=mask, causal=mask is None)
        self._active = wrapper
        self._pending = (wrapper, args, kwargs)
        if self._num_heads is not None:
            self._plan_pending()

    def _rows_for(self, metadata: AttentionMetadata) -> torch.Tensor:
        """K/V cache rows of the new tokens; graph-sized decode steps use the static buffer."""
        rows = kv_cache_rows(metadata.slot_mapping, self._require_spec().block_size)
        if metadata.is_pure_decode and metadata.num_requests in self._graph_decode:
            static = self._graph_rows[:, : metadata.num_tokens]
            static.copy_(rows, non_blocking=True)
            return static
        return rows

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

    def copy_slots(self, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
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
