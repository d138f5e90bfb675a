"""The CUDA-graph glue of the runner: which step shapes to capture for this engine, and capturing
them (kernels/cuda_graphs.py StepGraphRunner replays them). Only FlashInfer on CUDA captures;
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
    logger.info(
        "CUDA graphs: batch sizes %s x query rows 1..%d captured in %.1f s",
        graphs.shapes.batch_sizes,
        graphs.shapes.max_query_len,
        time.perf_counter() - start,
    )
    return graphs


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
