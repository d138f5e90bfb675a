"""ModelRunner: owns the model, the paged KV cache and the per-request RNGs; runs one step.

execute(): CoW block copies -> pack inputs -> one forward -> logits for the rows that need them ->
sample or verify per request -> one host sync -> ModelOutput (host data only). Tensors start
here; everything above it is plain Python.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Sequence

import torch

from engine.config import EngineConfig
from engine.input_batch import ModelInput, RequestRows, build_model_input
from engine.models.loader import load_model, resolve_model_path
from engine.outputs import Drafts, ModelOutput, RequestStepOutput, SchedulerOutput
from engine.request import Request
from engine.sampler import Sampler
from engine.speculation.batch_verify import SpecVerifier, sampling_rows
from kernels.attention import KVCacheSpec
from kernels.registry import make_attention_backend

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
RECYCLE_TOPK = 8  # target top-k kept per verified position for Token Recycling


class ModelRunner:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.device = torch.device(config.device.device)
        self.dtype = _DTYPES[config.model.dtype]
        self.block_size = config.cache.block_size
        self._set_threads()
        self.model_path = resolve_model_path(config.model.model)
        self.backend = make_attention_backend(
            config.device.attention_backend, self.device, dtype=self.dtype
        )
        self.model, self.arch = load_model(self.model_path, self.dtype, self.device, self.backend)
        self.max_model_len = min(
            config.model.max_model_len or self.arch.max_position_embeddings,
            self.arch.max_position_embeddings,
        )
        self.num_blocks = self._allocate_kv_cache()
        self.decode_graphs = self._capture_decode_graphs()
        self.sampler = Sampler()
        self.verifier = SpecVerifier(self.sampler)
        self.want_topk = config.spec.proposer == "recycle"
        self._generators: dict[str, torch.Generator] = {}

    def _set_threads(self) -> None:
        if self.config.device.threads is not None:
            torch.set_num_threads(self.config.device.threads)
        torch.manual_seed(self.config.model.seed)

    def _allocate_kv_cache(self) -> int:
        arch = self.arch
        probe = KVCacheSpec(
            arch.num_layers,
            1,
            self.block_size,
            arch.num_kv_heads,
            arch.head_dim,
            self.dtype,
            self.device,
        )
        num_blocks = self.config.cache.num_kv_blocks or max(
            2, self.config.cache.kv_cache_bytes // probe.bytes_per_block
        )
        spec = KVCacheSpec(
            arch.num_layers,
            num_blocks,
            self.block_size,
            arch.num_kv_heads,
            arch.head_dim,
            self.dtype,
            self.device,
        )
        self.backend.allocate(spec)
        logger.info(
            "KV cache: %d blocks x %d tokens (%.1f MiB, %s)",
            num_blocks,
            self.block_size,
            num_blocks * probe.bytes_per_block / 2**20,
            getattr(self.backend, "name", type(self.backend).__name__),
        )
        return num_blocks

    def _capture_decode_graphs(self):
        """CUDA graphs of the decode step (FlashInfer on CUDA, unless cuda_graphs is off)."""
        if not (
            self.config.device.cuda_graphs
            and self.device.type == "cuda"
            and getattr(self.backend, "name", "") == "flashinfer"
        ):
            return None
        from kernels.cuda_graphs import DecodeGraphRunner, graph_batch_sizes

        start = time.perf_counter()
        graphs = DecodeGraphRunner(
            self.backend,
            self.model,
            num_heads=self.arch.num_heads,
            max_model_len=self.max_model_len,
            sm_scale=self.arch.head_dim**-0.5,
            batch_sizes=graph_batch_sizes(self.config.scheduler.max_num_seqs),
        )
        graphs.capture()
        logger.info(
            "CUDA graphs: decode captured at batch sizes %s in %.1f s",
            graphs.batch_sizes,
            time.perf_counter() - start,
        )
        return graphs

    # ---- per-request state -------------------------------------------------------------
    def generator(self, request: Request) -> torch.Generator:
        gen = self._generators.get(request.request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(request.seed if request.seed is not None else random.getrandbits(63))
            self._generators[request.request_id] = gen
        return gen

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    # ---- the step ----------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, scheduler_output: SchedulerOutput, drafts: Drafts) -> ModelOutput:
        start = time.perf_counter()
        self._copy_blocks(scheduler_output.block_copies)
        model_input = build_model_input(scheduler_output, drafts, self.block_size, self.device)
        logits = self._forward(model_input)
        outputs = self._sample(model_input, logits, drafts)
        return ModelOutput(outputs=outputs, step_time=time.perf_counter() - start)

    def _copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        if not copies:
            return
        offsets = torch.arange(self.block_size, device=self.device)
        src = torch.cat([offsets + s * self.block_size for s, _ in copies])
        dst = torch.cat([offsets + d * self.block_size for _, d in copies])
        self.backend.copy_slots(src, dst)

    def _forward(self, model_input: ModelInput) -> torch.Tensor:
        metadata = model_input.metadata
        if self.decode_graphs is not None and self.decode_graphs.can_run(metadata):
            hidden = self.decode_graphs.run(model_input.input_ids, model_input.positions, metadata)
        else:
            self.backend.plan(metadata)
            hidden = self.model(model_input.input_ids, model_input.positions)
        if model_input.logits_indices.numel() == 0:
            return hidden.new_empty(0, self.arch.vocab_size, dtype=torch.float32)
        return self.model.compute_logits(hidden[model_input.logits_indices])

    def _sample(
        self, model_input: ModelInput, logits: torch.Tensor, drafts: Drafts
    ) -> dict[str, RequestStepOutput]:
        outputs: dict[str, RequestStepOutput] = {}
        plain = [
            rows for rows in model_input.requests if rows.logit_rows and not rows.draft_token_ids
        ]
        plain_tokens = self._sample_plain(plain, logits)
        for rows in model_input.requests:
            request_id = rows.scheduled.request_id
            try:
                outputs[request_id] = self._request_output(
                    rows, logits, drafts, plain_tokens.get(request_id)
                )
            except Exception as exc:  # one request's failure must not take the batch down
                logger.exception("request %s failed in the model runner", request_id)
                outputs[request_id] = RequestStepOutput(
                    request_id, (), error=f"{type(exc).__name__}: {exc}"
                )
        return outputs

    def _sample_plain(self, plain: list[RequestRows], logits: torch.Tensor) -> dict[str, int]:
        """Requests without drafts: one batched process + sample over their last rows."""
        if not plain:
            return {}
        row_index = torch.tensor([rows.logit_rows[0] for rows in plain], device=logits.device)
        requests = [rows.scheduled.request for rows in plain]
        probs = self.sampler.process(logits[row_index], sampling_rows(requests))
        tokens = self.sampler.sample(probs, [self._generator_if_seeded(r) for r in requests])
        return {r.request_id: t for r, t in zip(requests, tokens)}

    def _generator_if_seeded(self, request: Request) -> torch.Generator | None:
        return None if request.sampling_params.greedy else self.generator(request)

    def _request_output(
        self, rows: RequestRows, logits: torch.Tensor, drafts: Drafts, plain_token: int | None
    ) -> RequestStepOutput:
        request = rows.scheduled.request
        params = request.sampling_params
        prompt_logprobs = self._prompt_logprobs(rows, logits) if rows.prompt_logit_rows else ()
        if not rows.logit_rows:
            return RequestStepOutput(request.request_id, (), prompt_logprobs=prompt_logprobs)
        if plain_token is not None:
            token_ids, path_rows = (plain_token,), (rows.logit_rows[0],)
        else:
            token_ids, path_rows = self.verifier.verify(
                rows, logits, drafts, self._generator_if_seeded(request)
            )
            self._compact_tree(rows, path_rows)
        logprobs = ()
        if params.logprobs is not None:
            row_tensor = logits[torch.tensor(path_rows, device=logits.device)]
            logprobs = tuple(
                self.sampler.logprobs(row_tensor, token_ids, [params.logprobs] * len(token_ids))
            )
        topk = ()
        if self.want_topk:
            row_tensor = logits[torch.tensor(path_rows, device=logits.device)]
            topk = tuple(
                tuple(r) for r in torch.topk(row_tensor, RECYCLE_TOPK, dim=-1).indices.tolist()
            )
        return RequestStepOutput(
            request.request_id,
            tuple(token_ids),
            num_draft_tokens=len(rows.draft_token_ids),
            num_accepted_tokens=len(token_ids) - 1,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            next_token_topk=topk,
        )

    def _prompt_logprobs(self, rows: RequestRows, logits: torch.Tensor):
        """Row at position p scores prompt token p + 1; the prompt's first token has no logprob."""
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
            row_tensor = logits[torch.tensor([r for r, _ in targets], device=logits.device)]
            token_ids = [request.prompt_token_ids[p] for _, p in targets]
            num_top = [request.sampling_params.prompt_logprobs] * len(targets)
            entries.extend(self.sampler.logprobs(row_tensor, token_ids, num_top))
        return tuple(entries)

    def _compact_tree(self, rows: RequestRows, path_rows: Sequence[int]) -> None:
        """Copy the accepted tree path's K/V into the contiguous slots right after the root."""
        if rows.tree is None or len(path_rows) <= 1:
            return
        first_node_row = rows.logit_rows[1]
        base = (
            rows.first_slot_index + rows.num_real
        )  # slot index of node 0 == first slot after the root
        block_ids = rows.scheduled.request.block_ids
        src, dst = [], []
        for depth, row in enumerate(path_rows[1:]):
            node = row - first_node_row
            if node != depth:
                src.append(_slot(block_ids, base + node, self.block_size))
                dst.append(_slot(block_ids, base + depth, self.block_size))
        if src:
            self.backend.copy_slots(
                torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
            )


def _slot(block_ids: list[int], index: int, block_size: int) -> int:
    return block_ids[index // block_size] * block_size + index % block_size
