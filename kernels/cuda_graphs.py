"""Decode CUDA graphs: capture the model's decode step at batch sizes 1, 2, 4, ..., 64; replay.

Why: a small-batch decode step is launch-bound (a few kernels per layer, each microseconds of
GPU work); replaying one captured graph removes the per-kernel CPU launch cost.

What is captured: model_step(input_ids, positions) — embedding, every layer (K/V write by slot
+ FlashInfer decode run), final norm, and the logits if model_step computes them. What is not:
FlashInferBackend.plan(), which runs on the host before each replay and writes the new page
lists into the graph wrappers' fixed index buffers and the K/V rows into a static buffer.

A batch of n decode requests is padded to the next captured size with dummy requests that read
and write only the backend's pad block (kernels.flashinfer_metadata.pad_decode_metadata).
model_step must not sync with the host nor allocate shapes that depend on data.

The engine's ModelRunner captures these at start-up when the backend is FlashInfer on CUDA
(DeviceConfig.cuda_graphs, `--enforce-eager` turns it off). The padding arithmetic is tested on
CPU (tests/kernels/test_flashinfer_metadata.py), capture and replay by the gpu-marked tests.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.attention import AttentionMetadata
from kernels.flashinfer_backend import FlashInferBackend
from kernels.flashinfer_metadata import num_pages, pad_decode_metadata, padded_batch_size

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
ModelStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, positions) -> [n, ...]


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The default sizes a batch of up to max_num_seqs requests can be padded to."""
    sizes = [size for size in DEFAULT_BATCH_SIZES if size < max_num_seqs]
    larger = [size for size in DEFAULT_BATCH_SIZES if size >= max_num_seqs]
    return tuple(sizes + larger[:1])


def empty_decode_metadata(device: torch.device) -> AttentionMetadata:
    """A batch of zero requests, padded by pad_decode_metadata into an all-dummy batch."""
    return AttentionMetadata(
        query_start_loc=torch.zeros(1, dtype=torch.int32, device=device),
        seq_lens=torch.zeros(0, dtype=torch.int32, device=device),
        block_tables=torch.zeros(0, 1, dtype=torch.int32, device=device),
        slot_mapping=torch.zeros(0, dtype=torch.int64, device=device),
        query_lens_host=(),
        seq_lens_host=(),
    )


class DecodeGraphRunner:
    """Captured decode steps for a fixed set of batch sizes, sharing one memory pool."""

    def __init__(
        self,
        backend: FlashInferBackend,
        model_step: ModelStep,
        *,
        num_heads: int,
        max_model_len: int,
        sm_scale: float | None = None,
        batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES,
    ) -> None:
        self.backend = backend
        self.model_step = model_step
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.device = backend.kv_caches[0].device
        self.block_size = backend.kv_caches[0].shape[2]
        backend.set_attention_shape(num_heads, sm_scale)
        backend.enable_decode_graphs(self.batch_sizes, num_pages(max_model_len, self.block_size))
        max_size = self.batch_sizes[-1]
        self._input_ids = torch.zeros(max_size, dtype=torch.int64, device=self.device)
        self._positions = torch.zeros(max_size, dtype=torch.int64, device=self.device)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        self.num_replays = 0

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every batch size, largest first so smaller graphs fit in its memory pool."""
        pool = torch.cuda.graph_pool_handle()
        for size in reversed(self.batch_sizes):
            self.backend.plan(self._dummy_metadata(size))
            self._warm_up(size)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = self.model_step(self._input_ids[:size], self._positions[:size])
            self._graphs[size] = graph
            self._outputs[size] = output
        torch.cuda.synchronize(self.device)

    def _dummy_metadata(self, size: int) -> AttentionMetadata:
        return pad_decode_metadata(
            empty_decode_metadata(self.device), size, self.backend.pad_block_id, self.block_size
        )

    def _warm_up(self, size: int) -> None:
        # One eager run on a side stream first: lazy initialisation must not be captured.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.model_step(self._input_ids[:size], self._positions[:size])
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def can_run(self, metadata: AttentionMetadata) -> bool:
        return (
            bool(self._graphs)
            and metadata.is_pure_decode
            and padded_batch_size(metadata.num_requests, self.batch_sizes) is not None
        )

    @torch.inference_mode()
    def run(
        self, input_ids: torch.Tensor, positions: torch.Tensor, metadata: AttentionMetadata
    ) -> torch.Tensor:
        """Plan the padded batch on the host, fill the static inputs, replay; rows [:n] only."""
        num_requests = metadata.num_requests
        size = padded_batch_size(num_requests, self.batch_sizes)
        if size is None or not metadata.is_pure_decode:
            raise ValueError(f"no captured decode graph for {num_requests} requests")
        padded = pad_decode_metadata(metadata, size, self.backend.pad_block_id, self.block_size)
        self.backend.plan(padded)
        self._input_ids[:num_requests].copy_(input_ids)
        self._input_ids[num_requests:size].zero_()
        self._positions[:num_requests].copy_(positions)
        self._positions[num_requests:size].zero_()
        self._graphs[size].replay()
        self.num_replays += 1
        return self._outputs[size][:num_requests]
