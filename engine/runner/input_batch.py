"""Pack one step's scheduled requests (and their drafts) into flat model inputs.

Layout of request i's rows in the flattened batch (no padding anywhere):
    [ real tokens: all_token_ids[start : start + num_real] | draft tokens (chain or tree nodes) ]
Real tokens sit at positions start.., draft chain token j at the next positions, tree node n at
(position of the last real token) + depth(n). Every token, drafts included, gets its own cache
slot in order (start + row offset), so tree nodes occupy distinct slots; after verification the
runner copies the accepted path down into the contiguous slots (DESIGN §4).

Logit rows: a request that reaches its last known token needs logits for that token and for
every draft (1 + num_draft_tokens rows, in row order); prompt logprobs need every real row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from engine.outputs import Drafts, DraftTree, ScheduledRequest, SchedulerOutput
from engine.request import Request
from engine.sample.tree import tree_positions, visible_rows
from kernels.attention import AttentionMetadata


class RequestRows(NamedTuple):
    """Where one request's rows landed in the batch and in the logits tensor (a named tuple:
    a step builds one per request, five times faster than a frozen dataclass)."""

    scheduled: ScheduledRequest
    draft_token_ids: tuple[int, ...]  # chain tokens or tree node tokens, in row order
    tree: DraftTree | None
    first_slot_index: int  # token index (position in the request's slot space) of the first row
    num_real: int
    logit_rows: tuple[int, ...]  # indices into the logits tensor: [root, drafts...] when sampling
    prompt_logit_rows: tuple[int, ...]  # indices into the logits tensor for prompt logprobs

    @property
    def request(self) -> Request:
        return self.scheduled.request


@dataclass(frozen=True)
class ModelInput:
    """Built on the host (a CUDA-graph step plans and stages from host tensors); `to(device)`
    gives the eager path its device copy."""

    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    metadata: AttentionMetadata
    logits_indices: torch.Tensor  # [num_logit_rows] int64, rows of the hidden states to project
    requests: tuple[RequestRows, ...]

    def to(self, device: torch.device) -> ModelInput:
        if device.type == "cpu":
            return self
        metadata = self.metadata
        return replace(
            self,
            input_ids=self.input_ids.to(device),
            positions=self.positions.to(device),
            logits_indices=self.logits_indices.to(device),
            metadata=replace(
                metadata,
                query_start_loc=metadata.query_start_loc.to(device),
                seq_lens=metadata.seq_lens.to(device),
                block_tables=metadata.block_tables.to(device),
                slot_mapping=metadata.slot_mapping.to(device),
                tree_masks=tuple(m if m is None else m.to(device) for m in metadata.tree_masks),
                window_block_tables=_to(metadata.window_block_tables, device),
                window_slot_mapping=_to(metadata.window_slot_mapping, device),
            ),
        )


def _to(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def slot_of(block_ids: list[int], index: int, block_size: int) -> int:
    """The cache slot of a request's token index (DESIGN §4)."""
    return block_ids[index // block_size] * block_size + index % block_size


def tree_attention_mask(num_real: int, tree: DraftTree) -> torch.Tensor:
    """[q_len, q_len] bool over [real tokens..., nodes...]: real tokens are causal (the last one
    is the tree's root); a node sees every real token, its ancestors and itself."""
    q_len = num_real + tree.num_nodes
    mask = torch.zeros(q_len, q_len, dtype=torch.bool)
    mask[:num_real, :num_real] = torch.tril(torch.ones(num_real, num_real, dtype=torch.bool))
    for row, visible in enumerate(visible_rows(tree)[1:], start=num_real):
        mask[row, :num_real] = True
        mask[row, [num_real - 1 + v for v in visible[1:]]] = True
    return mask


def _plain_decode(scheduled: ScheduledRequest) -> bool:
    request = scheduled.request
    return scheduled.needs_sample and (
        request.sampling_params.prompt_logprobs is None
        or scheduled.start >= request.num_prompt_tokens
    )


def _table(block_tables: list[list[int]]) -> torch.Tensor:
    """[num_requests, max_blocks] int32, 0-padded."""
    max_blocks = max((len(t) for t in block_tables), default=1) or 1
    table = np.zeros((len(block_tables), max_blocks), dtype=np.int32)
    for i, blocks in enumerate(block_tables):
        table[i, : len(blocks)] = blocks
    return torch.from_numpy(table)


def _window_view(rows: list[RequestRows], block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The window pool's (tables, slots) for the step: the rows' token indices in order, as
    the step's slot_mapping has them."""
    tables = [r.request.window_block_ids for r in rows]
    window_slots = []
    for r in rows:
        first = r.first_slot_index
        q_len = r.num_real + len(r.draft_token_ids)
        table = r.request.window_block_ids
        window_slots.extend(slot_of(table, first + j, block_size) for j in range(q_len))
    # Released entries (NULL_BLOCK) read as block 0: no kernel reads keys outside the window.
    return _table(tables).clamp_(min=0), torch.tensor(window_slots, dtype=torch.int64)


def build_model_input(
    scheduler_output: SchedulerOutput, drafts: Drafts, block_size: int, windowed: bool = False
) -> ModelInput:
    """The step's inputs as host tensors; `windowed`: the cache has a window pool."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu_query: list[int] = [0]
    seq_lens: list[int] = []
    block_tables: list[list[int]] = []
    tree_masks: list[torch.Tensor | None] = []
    logits_indices: list[int] = []
    rows: list[RequestRows] = []
    for scheduled in scheduler_output.scheduled:
        request = scheduled.request
        start = scheduled.start
        num_real = scheduled.num_new_tokens - scheduled.num_draft_tokens
        if num_real == 1 and not scheduled.num_draft_tokens and _plain_decode(scheduled):
            # The common row (one token, nothing drafted, no prompt logprobs), written out:
            # the same values as the general path below, for a quarter of its time.
            logit_row = len(logits_indices)
            logits_indices.append(len(input_ids))
            input_ids.append(request.token_ids_between(start, start + 1)[0])
            positions.append(start)
            slots.append(slot_of(request.block_ids, start, block_size))
            cu_query.append(cu_query[-1] + 1)
            seq_lens.append(start + 1)
            block_tables.append(request.block_ids)
            tree_masks.append(None)
            rows.append(RequestRows(scheduled, (), None, start, 1, (logit_row,), ()))
            continue
        tree = drafts.trees.get(request.request_id) if scheduled.needs_sample else None
        chain = (
            ()
            if tree is not None or not scheduled.needs_sample
            else tuple(drafts.chains.get(request.request_id, ()))
        )
        draft_ids = tree.token_ids if tree is not None else chain
        draft_ids = tuple(draft_ids[: scheduled.num_draft_tokens])
        if tree is not None and len(draft_ids) < tree.num_nodes:
            raise ValueError(
                f"request {request.request_id}: tree of {tree.num_nodes} nodes exceeds {scheduled.num_draft_tokens} slots"
            )
        row0 = len(input_ids)
        input_ids.extend(request.token_ids_between(start, start + num_real))
        input_ids.extend(draft_ids)
        positions.extend(range(start, start + num_real))
        if tree is not None:
            positions.extend(tree_positions(tree, start + num_real)[1:])
        else:
            positions.extend(range(start + num_real, start + num_real + len(draft_ids)))
        q_len = num_real + len(draft_ids)
        slots.extend(slot_of(request.block_ids, start + j, block_size) for j in range(q_len))
        cu_query.append(cu_query[-1] + q_len)
        seq_lens.append(start + q_len)
        block_tables.append(request.block_ids)
        tree_masks.append(tree_attention_mask(num_real, tree) if tree is not None else None)
        prompt_rows: tuple[int, ...] = ()
        if (
            request.sampling_params.prompt_logprobs is not None
            and start < request.num_prompt_tokens
        ):
            end = min(start + num_real, request.num_prompt_tokens)
            prompt_rows = tuple(range(len(logits_indices), len(logits_indices) + end - start))
            logits_indices.extend(range(row0, row0 + end - start))
        sample_rows: tuple[int, ...] = ()
        if scheduled.needs_sample:
            first = row0 + num_real - 1
            sample_rows = tuple(
                range(len(logits_indices), len(logits_indices) + 1 + len(draft_ids))
            )
            logits_indices.extend(range(first, first + 1 + len(draft_ids)))
        rows.append(
            RequestRows(scheduled, draft_ids, tree, start, num_real, sample_rows, prompt_rows)
        )
    window_tables, window_slots = _window_view(rows, block_size) if windowed else (None, None)
    metadata = AttentionMetadata(
        query_start_loc=torch.tensor(cu_query, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=_table(block_tables),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_lens_host=tuple(b - a for a, b in zip(cu_query, cu_query[1:])),
        seq_lens_host=tuple(seq_lens),
        tree_masks=tuple(tree_masks),
        window_block_tables=window_tables,
        window_slot_mapping=window_slots,
    )
    return ModelInput(
        input_ids=torch.tensor(input_ids, dtype=torch.int64),
        positions=torch.tensor(positions, dtype=torch.int64),
        metadata=metadata,
        logits_indices=torch.tensor(logits_indices, dtype=torch.int64),
        requests=tuple(rows),
    )
