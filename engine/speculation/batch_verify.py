"""Glue between the model runner and the verification maths (engine/speculation/verify.py).

For one request with drafts, build the sampling rows of [root, drafts...] — each row's penalty
history includes the drafts before it, so p is exactly the distribution the request would have
sampled from at that position — turn its logits into p, verify, and report which logits rows
produced the emitted tokens (for logprobs and Token Recycling's top-k).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.input_batch import RequestRows
from engine.outputs import Drafts
from engine.request import Request
from engine.sampler import Sampler, SamplingRow
from engine.speculation.tree import path_to
from engine.speculation.verify import (
    VerifyResult,
    verify_greedy_chain,
    verify_greedy_tree,
    verify_sampled_chain,
    verify_sampled_tree,
)


def sampling_row(request: Request, extra_output: Sequence[int] = ()) -> SamplingRow:
    """The sampler's view of a request at the position after output + extra_output tokens."""
    params = request.sampling_params
    needs_history = params.needs_penalties or params.min_tokens > 0
    blocked = ()
    if params.min_tokens > 0:
        eos = () if request.eos_token_id is None or params.ignore_eos else (request.eos_token_id,)
        blocked = (*eos, *params.stop_token_ids)
    return SamplingRow(
        params=params,
        output_token_ids=[*request.output_token_ids, *extra_output] if needs_history else (),
        prompt_token_ids=request.prompt_token_ids if params.repetition_penalty != 1 else (),
        stop_ids_blocked=blocked,
    )


def sampling_rows(requests: Sequence[Request]) -> list[SamplingRow]:
    return [sampling_row(request) for request in requests]


class SpecVerifier:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(
        self,
        rows: RequestRows,
        logits: torch.Tensor,
        drafts: Drafts,
        generator: torch.Generator | None,
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Returns (emitted token ids, logits row of each emitted token)."""
        request = rows.scheduled.request
        draft_ids = list(rows.draft_token_ids)
        index = torch.tensor(rows.logit_rows, device=logits.device)
        probs = self.sampler.process(logits[index], self._rows(rows, request, draft_ids))
        q = drafts.probs.get(request.request_id)
        result = self._verify(rows, probs, draft_ids, q, generator, request.sampling_params.greedy)
        if rows.tree is None:
            path_rows = rows.logit_rows[: result.num_accepted + 1]
        else:
            path_rows = (
                rows.logit_rows[0],
                *(rows.logit_rows[1 + n] for n in result.accepted_node_ids),
            )
        return result.token_ids, tuple(path_rows)

    @staticmethod
    def _rows(rows: RequestRows, request: Request, draft_ids: list[int]) -> list[SamplingRow]:
        if rows.tree is None:
            return [sampling_row(request, draft_ids[:j]) for j in range(len(draft_ids) + 1)]
        histories = [[]] + [
            [rows.tree.token_ids[n] for n in path_to(rows.tree, node)]
            for node in range(rows.tree.num_nodes)
        ]
        return [sampling_row(request, history) for history in histories]

    @staticmethod
    def _verify(rows: RequestRows, probs, draft_ids, q, generator, greedy: bool) -> VerifyResult:
        if rows.tree is not None:
            if greedy:
                return verify_greedy_tree(rows.tree, probs.argmax(dim=-1).tolist())
            return verify_sampled_tree(rows.tree, probs, q, generator)
        if greedy:
            return verify_greedy_chain(probs.argmax(dim=-1).tolist(), draft_ids)
        return verify_sampled_chain(probs, draft_ids, q, generator)
