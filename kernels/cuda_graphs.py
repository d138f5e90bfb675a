"""Step CUDA graphs: the model step captured per (batch size, query rows per request); replayed.

Why: a small-batch step is launch-bound (a few kernels per layer, each microseconds of GPU
work); replaying one captured graph removes the per-kernel CPU launch cost. Decode steps
(1 row per request) and chain verification steps (1 + k rows) are both captured, so
speculation stays on the graph path.

What is captured: model_step(input_ids, positions), embedding, every layer (K/V write by cache
row + FlashInfer's tensor-core decode run with q_len_per_req rows), final norm. What is not:
FlashInferBackend.plan_graph(), which runs on the host before each replay and writes the page
lists into the wrapper's fixed buffers.

A replayable step (kernels.graph_shapes.GraphShapes) is padded to the smallest captured batch
size and to its longest query (flashinfer_metadata.pad_uniform: dummy rows write only the pad
block). Host work per replay is numpy plus one pinned host-to-device copy that carries the
token ids, positions, K/V cache rows and the rows to gather for logits. model_step must not
sync with the host nor allocate shapes that depend on data.

The engine's ModelRunner captures these at start-up when the backend is FlashInfer on CUDA
(DeviceConfig.cuda_graphs; `--enforce-eager` turns it off). Padding and staging are tested on
CPU with an emulated FlashInfer (tests/kernels/test_flashinfer_backend_cpu.py), capture and
replay by the gpu-marked tests.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from kernels.attention import AttentionMetadata
from kernels.flashinfer_backend import FlashInferBackend
from kernels.flashinfer_metadata import UniformBatch, num_pages, pad_uniform
from kernels.graph_shapes import GraphShapes

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
ModelStep = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (ids, positions) -> [n, ...]
_FIELDS = 5  # staged per step: ids, positions, K rows, V rows, then the rows to gather


def graph_batch_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """The default sizes a batch of up to max_num_seqs requests can be padded to."""
    sizes = [size for size in DEFAULT_BATCH_SIZES if size < max_num_seqs]
    larger = [size for size in DEFAULT_BATCH_SIZES if size >= max_num_seqs]
    return tuple(sizes + larger[:1])


def empty_metadata() -> AttentionMetadata:
    """A batch of zero requests on the host, padded by pad_uniform into an all-dummy batch."""
    return AttentionMetadata(
        query_start_loc=torch.zeros(1, dtype=torch.int32),
        seq_lens=torch.zeros(0, dtype=torch.int32),
        block_tables=torch.zeros(0, 1, dtype=torch.int32),
        slot_mapping=torch.zeros(0, dtype=torch.int64),
        query_lens_host=(),
        seq_lens_host=(),
    )


class StepGraphRunner:
    """Captured steps for every shape of `shapes`, sharing one memory pool and one static
    input buffer (a shape of n rows reads its inputs at fixed offsets of it)."""

    def __init__(
        self,
        backend: FlashInferBackend,
        model_step: ModelStep,
        shapes: GraphShapes,
        *,
        num_heads: int,
        max_model_len: int,
        sm_scale: float | None = None,
    ) -> None:
        self.backend = backend
        self.model_step = model_step
        self.shapes = shapes
        self.device = backend.kv_caches[0].device
        self.block_size = backend.kv_caches[0].shape[2]
        max_rows = shapes.batch_sizes[-1] * shapes.max_query_len
        backend.set_attention_shape(num_heads, sm_scale)
        # A padded request lists its pages plus pad pages up to max_query_len rows further.
        backend.enable_graphs(
            shapes.all_shapes(), num_pages(max_model_len + shapes.max_query_len, self.block_size)
        )
        pin = self.device.type == "cuda"
        self._host = torch.zeros(_FIELDS * max_rows, dtype=torch.int64, pin_memory=pin)
        self._static = torch.zeros(_FIELDS * max_rows, dtype=torch.int64, device=self.device)
        self._copied = torch.cuda.Event() if pin else None  # the last staging copy's end
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph | None] = {}
        self._outputs: dict[tuple[int, int], torch.Tensor] = {}
        self.num_replays = 0

    # ---- static inputs: shape of n rows -> views at fixed offsets -------------------------
    def _ids(self, n: int) -> torch.Tensor:
        return self._static[:n]

    def _positions(self, n: int) -> torch.Tensor:
        return self._static[n : 2 * n]

    def _kv_rows(self, n: int) -> torch.Tensor:
        return self._static[2 * n : 4 * n].view(2, n)

    def _gather(self, n: int, count: int) -> torch.Tensor:
        return self._static[4 * n : 4 * n + count]

    # ---- capture ---------------------------------------------------------------------------
    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every shape, largest first so smaller graphs fit in its memory pool."""
        pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        for batch, q_len in sorted(self.shapes.all_shapes(), key=lambda s: -s[0] * s[1]):
            padded = self._pad(empty_metadata(), batch, q_len)
            nothing = torch.zeros(0, dtype=torch.int64)
            self._stage(padded, nothing, nothing, np.zeros(0, dtype=np.int64))
            n = padded.num_rows
            self.backend.plan_graph(padded.metadata, self._kv_rows(n))
            if self.device.type != "cuda":  # tests on CPU: the same step, run eagerly
                self._graphs[(batch, q_len)] = None
                continue
            self._warm_up(n)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                output = self.model_step(self._ids(n), self._positions(n))
            # PyTorch's capture instantiates the graph but does not upload it, and CUDA uploads
            # an executable graph at its first launch. Replaying it here, on the dummy batch
            # just staged and planned (its rows write only the pad block), moves that upload
            # to start-up, out of the first real step of each shape. Not yet timed on a GPU:
            # it may be the 2.5-4.5 ms first-of-a-kind stalls of docs/benchmarks.md §4j.
            graph.replay()
            self._graphs[(batch, q_len)] = graph
            self._outputs[(batch, q_len)] = output
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _warm_up(self, n: int) -> None:
        # One eager run on a side stream first: lazy initialisation must not be captured.
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.model_step(self._ids(n), self._positions(n))
        torch.cuda.current_stream(self.device).wait_stream(stream)

    # ---- replay ----------------------------------------------------------------------------
    def can_run(self, metadata: AttentionMetadata) -> bool:
        return bool(self._graphs) and self.shapes.replays(
            metadata.query_lens_host, tree=any(m is not None for m in metadata.tree_masks)
        )

    @torch.inference_mode()
    def run(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        metadata: AttentionMetadata,
        gather_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states of rows `gather_rows` (real-row numbering) of the step given by host
        tensors input_ids [T], positions [T] and metadata: padded, planned on the host, staged
        in one copy, replayed. Returns [len(gather_rows), ...] on the device."""
        if not self.can_run(metadata):
            raise ValueError(f"no captured graph for query lengths {metadata.query_lens_host}")
        shape = self.shapes.padded(metadata.num_requests, max(metadata.query_lens_host))
        padded = self._pad(metadata, *shape)
        n = padded.num_rows
        self._stage(padded, input_ids, positions, padded.rows[gather_rows.numpy()])
        self.backend.plan_graph(padded.metadata, self._kv_rows(n))
        hidden = self._replay(shape, n)
        self.num_replays += 1
        return hidden.index_select(0, self._gather(n, len(gather_rows)))

    def _replay(self, shape: tuple[int, int], n: int) -> torch.Tensor:
        graph = self._graphs[shape]
        if graph is None:  # CPU (tests): the captured step run eagerly on the static inputs
            return self.model_step(self._ids(n), self._positions(n))
        graph.replay()
        return self._outputs[shape]

    def _pad(self, metadata: AttentionMetadata, batch: int, q_len: int) -> UniformBatch:
        return pad_uniform(metadata, batch, q_len, self.backend.pad_block_id, self.block_size)

    def _stage(
        self,
        padded: UniformBatch,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        gather: np.ndarray,
    ) -> None:
        """Write the padded step's inputs into the pinned host buffer, then copy them to the
        static buffer in one transfer. Dummy rows get token 0 at position 0."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous copy has read the host buffer
        n, rows = padded.num_rows, padded.rows
        host = self._host.numpy()
        host[: 2 * n] = 0
        host[:n][rows] = input_ids.numpy()
        host[n : 2 * n][rows] = positions.numpy()
        slots = padded.metadata.slot_mapping.numpy()
        k_rows = slots // self.block_size * self.block_size + slots  # kv_cache_rows, in numpy
        host[2 * n : 3 * n] = k_rows
        host[3 * n : 4 * n] = k_rows + self.block_size
        host[4 * n : 4 * n + len(gather)] = gather
        end = 4 * n + len(gather)
        self._static[:end].copy_(self._host[:end], non_blocking=True)
        if self._copied is not None:
            self._copied.record()
