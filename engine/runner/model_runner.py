"""ModelRunner: owns the model and the paged KV cache; runs one step.

execute(): CoW block copies -> pack inputs -> one forward (a replayed CUDA graph for decode
steps on FlashInfer) -> logits for the rows that need them -> one batched sample + verify pass
with one host sync (engine/sample/batch_verify.py) -> accepted tree paths compacted ->
logprobs where asked -> ModelOutput (host data only). Tensors start here; everything above it
is plain Python. The runner keeps no per-request state: random numbers come from each
request's seed and token positions (engine/sample/rng.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from engine.config import EngineConfig
from engine.core.block_manager import BlockCopy
from engine.core.kv_budget import KVSplit, split_kv_cache
from engine.models.linear import weight_format
from engine.models.loader import load_model, resolve_model_path
from engine.outputs import Drafts, ModelOutput, RequestStepOutput, SchedulerOutput
from engine.runner.graphs import capture_graphs
from engine.runner.input_batch import ModelInput, build_model_input, slot_of
from engine.sample.batch_verify import BatchVerifier, Verified
from engine.sample.sampler import Sampler
from kernels.attention import KVCacheSpec
from kernels.cpu.thread_policy import ThreadPolicy
from kernels.graph_shapes import GraphShapes
from kernels.registry import make_attention_backend

if TYPE_CHECKING:
    from kernels.cuda_graphs import StepGraphRunner

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _kv_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    return model_dtype if name == "auto" else _DTYPES[name]


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device.device)
        self.dtype = _DTYPES[config.model.dtype]
        self.kv_dtype = _kv_dtype(config.cache.kv_cache_dtype, self.dtype)
        self.block_size = config.cache.block_size
        self._set_threads()
        self.model_path = resolve_model_path(config.model.model)
        self.backend = make_attention_backend(
            config.device.attention_backend, self.device, dtype=self.dtype
        )
        if getattr(self.backend, "name", "") == "flashinfer" and self.kv_dtype != self.dtype:
            raise ValueError("FlashInfer attention keeps the KV cache in --dtype's type")
        self.model, self.arch = load_model(
            self.model_path, self.dtype, self.device, self.backend, config.model.weights
        )
        self.weight_format = weight_format(self.model)
        self.max_model_len = min(
            config.model.max_model_len or self.arch.max_position_embeddings,
            self.arch.max_position_embeddings,
        )
        self.kv_split = self._allocate_kv_cache()
        self.num_blocks = self.kv_split.num_blocks
        self.graphs: StepGraphRunner | None = capture_graphs(
            config, self.backend, self.model, self.arch, self.max_model_len, self.device
        )
        self.sampler = Sampler()
        self.verifier = BatchVerifier(self.sampler)

    def _set_threads(self) -> None:
        if self.config.device.threads is not None:
            torch.set_num_threads(self.config.device.threads)
        self.thread_policy = None
        if self.config.device.thread_policy == "adaptive" and self.device.type == "cpu":
            self.thread_policy = ThreadPolicy(torch.get_num_threads())
            torch.set_num_threads(self.thread_policy.current)
        torch.manual_seed(self.config.model.seed)

    def _follow_free_cores(self) -> None:
        """The compute threads for this step (kernels/cpu/thread_policy.py): one fewer while
        another process holds a core, so no thread waits at a barrier for a descheduled one."""
        if self.thread_policy is None:
            return
        threads = self.thread_policy.threads()
        if threads != torch.get_num_threads():
            logger.info("compute threads: %d -> %d (cores free)", torch.get_num_threads(), threads)
            torch.set_num_threads(threads)

    def _allocate_kv_cache(self) -> KVSplit:
        arch = self.arch
        probe = KVCacheSpec(
            arch.num_layers,
            1,
            self.block_size,
            arch.num_kv_heads,
            arch.head_dim,
            self.kv_dtype,
            self.device,
        )
        num_unsplit = self.config.cache.num_kv_blocks or max(
            2, self.config.cache.kv_cache_bytes // probe.bytes_per_block
        )
        split = self._split(num_unsplit)
        spec = KVCacheSpec(
            arch.num_layers,
            split.num_blocks,
            self.block_size,
            arch.num_kv_heads,
            arch.head_dim,
            self.kv_dtype,
            self.device,
            arch.layer_windows,
            split.window.num_blocks if split.window else 0,
        )
        self.backend.allocate(spec)
        layer_blocks = sum(spec.blocks_of(i) for i in range(arch.num_layers))
        logger.info(
            "KV cache: %d blocks x %d tokens (%.1f MiB, %s, %s)%s",
            split.num_blocks,
            self.block_size,
            layer_blocks * probe.bytes_per_block / arch.num_layers / 2**20,
            str(self.kv_dtype).removeprefix("torch."),
            getattr(self.backend, "name", type(self.backend).__name__),
            f"; the sliding-window layers' own pool: {split.window.num_blocks} blocks"
            if split.window
            else "",
        )
        return split

    def _split(self, num_unsplit: int) -> KVSplit:
        """The window layers' own pool where the backend reads one (engine/core/kv_budget.py:
        not beside a draft model)."""
        if not self.config.cache.sliding_window_pool or not getattr(
            self.backend, "reads_window_pool", False
        ):
            return KVSplit(num_unsplit, None)
        return split_kv_cache(
            num_unsplit,
            self.arch.layer_windows or (0,) * self.arch.num_layers,
            self.block_size,
            self.config.scheduler.max_num_seqs,
            self.config.scheduler.max_num_batched_tokens,
            -(-self.max_model_len // self.block_size),
            mirrored=bool(self.config.spec.draft_model),
        )

    @property
    def graph_shapes(self) -> GraphShapes:
        """The step shapes this runner replays as graphs (none without graphs)."""
        return self.graphs.shapes if self.graphs is not None else GraphShapes()

    # ---- the step ----------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput, drafts: Drafts) -> ModelOutput:
        self._follow_free_cores()
        start = time.perf_counter()
        self._copy_blocks(scheduler_output.block_copies)
        model_input = build_model_input(
            scheduler_output, drafts, self.block_size, self.kv_split.window is not None
        )
        logits = self._logits(model_input)
        verified = self.verifier.verify(model_input.requests, logits, drafts.target_topk)
        self._compact_trees(model_input.requests, verified)
        outputs = self._outputs(model_input, logits, verified)
        return ModelOutput(outputs=outputs, step_time=time.perf_counter() - start)

    def _copy_blocks(self, copies: Sequence[BlockCopy]) -> None:
        if not copies:  # most steps: no device work, no launch
            return
        offsets = torch.arange(self.block_size, device=self.device)
        for window in (False, True):
            pool = [c for c in copies if c.window == window]
            if pool:
                src = torch.cat([offsets + c.src * self.block_size for c in pool])
                dst = torch.cat([offsets + c.dst * self.block_size for c in pool])
                self.backend.copy_slots(src, dst, window)

    def _logits(self, model_input: ModelInput) -> torch.Tensor:
        """float32 logits [num_logit_rows, vocab]: the step replayed as a graph where its
        shape was captured, else run eagerly."""
        if self.graphs is not None and self.graphs.can_run(model_input.metadata):
            hidden = self.graphs.run(
                model_input.input_ids,
                model_input.positions,
                model_input.metadata,
                model_input.logits_indices,
            )
        else:
            on_device = model_input.to(self.device)
            self.backend.plan(on_device.metadata)
            hidden = self.model(on_device.input_ids, on_device.positions)
            hidden = hidden[on_device.logits_indices]
        if hidden.shape[0] == 0:
            return hidden.new_empty(0, self.arch.vocab_size, dtype=torch.float32)
        return self.model.compute_logits(hidden)

    def _outputs(
        self, model_input: ModelInput, logits: torch.Tensor, verified: dict[str, Verified]
    ) -> dict[str, RequestStepOutput]:
        """Per request: the verified tokens with their logprobs, and prompt logprobs."""
        logprobs = self._logprobs(model_input.requests, logits, verified)
        prompt_logprobs = self._prompt_logprobs(model_input.requests, logits)
        outputs = {}
        for rows in model_input.requests:
            request_id = rows.scheduled.request_id
            done = verified.get(request_id)
            outputs[request_id] = RequestStepOutput(
                request_id,
                done.token_ids if done else (),
                num_draft_tokens=done.num_draft_tokens if done else 0,
                num_accepted_tokens=done.num_accepted_tokens if done else 0,
                logprobs=logprobs.get(request_id, ()),
                prompt_logprobs=prompt_logprobs.get(request_id, ()),
                target_topk_ids=done.target_topk_ids if done else (),
                draft_topk_ids=done.draft_topk_ids if done else (),
                error=done.error if done else None,
            )
        return outputs

    def _logprobs(self, requests, logits: torch.Tensor, verified: dict[str, Verified]):
        """Logprobs of every emitted token that asked for them, in one batched call."""
        if all(rows.request.sampling_params.logprobs is None for rows in requests):
            return {}  # most steps
        asking = [
            (rows, verified[rows.scheduled.request_id])
            for rows in requests
            if rows.scheduled.request_id in verified
            and verified[rows.scheduled.request_id].error is None
            and rows.scheduled.request.sampling_params.logprobs is not None
        ]
        if not asking:
            return {}
        index = torch.tensor([r for _, done in asking for r in done.path_rows], device=self.device)
        token_ids = [t for _, done in asking for t in done.token_ids]
        num_top = [
            rows.scheduled.request.sampling_params.logprobs
            for rows, done in asking
            for _ in done.token_ids
        ]
        entries = self.sampler.logprobs(logits[index], token_ids, num_top)
        result, first = {}, 0
        for rows, done in asking:
            result[rows.scheduled.request_id] = tuple(entries[first : first + len(done.token_ids)])
            first += len(done.token_ids)
        return result

    def _prompt_logprobs(self, requests, logits: torch.Tensor):
        """Row at position p scores prompt token p + 1; the prompt's first token has no logprob."""
        result = {}
        for rows in requests:
            if not rows.prompt_logit_rows:
                continue
            request = rows.scheduled.request
            start = rows.first_slot_index
            entries = [None] if start == 0 else []
            targets = [
                (row, p + 1)
                for row, p in zip(
                    rows.prompt_logit_rows, range(start, start + len(rows.prompt_logit_rows))
                )
                if p + 1 < request.num_prompt_tokens
            ]
            if targets:
                index = torch.tensor([r for r, _ in targets], device=logits.device)
                token_ids = [request.prompt_token_ids[p] for _, p in targets]
                num_top = [request.sampling_params.prompt_logprobs] * len(targets)
                entries.extend(self.sampler.logprobs(logits[index], token_ids, num_top))
            result[rows.scheduled.request_id] = tuple(entries)
        return result

    def _compact_trees(self, requests, verified: dict[str, Verified]) -> None:
        """Copy each accepted tree path's K/V into the contiguous slots right after the root."""
        moves = []  # (request, from token index, to token index)
        for rows in requests:
            done = verified.get(rows.scheduled.request_id)
            if rows.tree is None or done is None:
                continue
            base = rows.first_slot_index + rows.num_real  # slot index of node 0
            request = rows.scheduled.request
            moves.extend(
                (request, base + node, base + depth)
                for depth, node in enumerate(done.accepted_node_ids)
                if node != depth
            )
        if not moves:
            return
        for window in (False, True) if self.kv_split.window else (False,):
            tables = [r.window_block_ids if window else r.block_ids for r, _, _ in moves]
            src = [slot_of(t, a, self.block_size) for t, (_, a, _) in zip(tables, moves)]
            dst = [slot_of(t, b, self.block_size) for t, (_, _, b) in zip(tables, moves)]
            self.backend.copy_slots(
                torch.tensor(src, device=self.device),
                torch.tensor(dst, device=self.device),
                window,
            )
