"""The CUDA-graph glue of the runner: which step shapes to capture for this engine, capturing
them (kernels/cuda_graphs.py StepGraphRunner replays them), and warming the lm_head that runs
after a replay at every row count a step may gather. Only FlashInfer on CUDA captures;
everywhere else the runner runs every step eagerly.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from kernels.graph_shapes import GraphShapes

if TYPE_CHECKING:
    from kernels.cuda_graphs import StepGraphRunner

logger = logging.getLogger(__name__)

# Chain verification steps are captured up to this many drafts per request; a longer chain
# cap (--num-speculative-tokens) captures decode steps only (about 7 graphs per extra row).
MAX_GRAPHED_DRAFTS = 8


def capture_graphs(
    config: EngineConfig, backend, model, arch, max_model_len: int, device: torch.device
) -> StepGraphRunner | None:
    """CUDA graphs of decode and chain-verification steps (FlashInfer on CUDA, unless
    cuda_graphs is off)."""
    if not (
        config.device.cuda_graphs
        and device.type == "cuda"
        and getattr(backend, "name", "") == "flashinfer"
    ):
        return None
    from kernels.cuda_graphs import StepGraphRunner

    start = time.perf_counter()
    graphs = StepGraphRunner(
        backend,
        model,
        graph_shapes(config),
        num_heads=arch.num_heads,
        max_model_len=max_model_len,
        sm_scale=arch.head_dim**-0.5,
    )
    graphs.capture()
    shapes = graphs.shapes
    max_rows = max(shapes.batch_sizes[-1] * shapes.max_query_len, config.scheduler.max_num_seqs)
    warm_logits(model, arch.hidden_size, max_rows, device)
    logger.info(
        "CUDA graphs: batch sizes %s x query rows 1..%d captured, lm_head warmed at 1..%d "
        "rows, in %.1f s",
        shapes.batch_sizes,
        shapes.max_query_len,
        max_rows,
        time.perf_counter() - start,
    )
    return graphs


@torch.inference_mode()
def warm_logits(model, hidden_size: int, max_rows: int, device: torch.device) -> None:
    """Run the lm_head once at every row count 1..max_rows a step may gather, so that each
    count's matrix kernel is chosen and loaded at start-up. The lm_head runs outside the
    graphs on the rows a step samples, and on the H200 the first step of a new count spent
    2.2 ms there against 0.12 ms on its repeats (docs/benchmarks.md §4k: the 2.5-4.5 ms
    first-of-a-count stalls of §4j)."""
    hidden = torch.zeros(max_rows, hidden_size, dtype=model_dtype(model), device=device)
    for rows in range(1, max_rows + 1):
        model.compute_logits(hidden[:rows])
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def model_dtype(model) -> torch.dtype:
    """The dtype of the model's floating weights (its hidden states')."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


def graph_shapes(config: EngineConfig) -> GraphShapes:
    """What to capture: decode steps at the batch sizes max_num_seqs needs, and chain
    verification steps up to the spec cap when chains may be verified (a tree proposer's
    steps carry masks and run eagerly)."""
    from kernels.cuda_graphs import graph_batch_sizes

    spec = config.spec
    chains = spec.proposers and spec.spec_tree_nodes == 0 and spec.policy != "off"
    drafts = spec.chain_cap if chains else 0
    max_query_len = 1 + drafts if drafts <= MAX_GRAPHED_DRAFTS else 1
    return GraphShapes(graph_batch_sizes(config.scheduler.max_num_seqs), max_query_len)
