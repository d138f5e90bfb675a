"""BatchVerifier: one batched pass over the step's sample rows, with one host sync (DESIGN §5).

Every request whose chunk reaches its last known token owns consecutive sample rows in the
step's logits: [root] when it decodes plainly (a chain of zero drafts), [root, drafts...] for
a chain, [root, nodes...] for a tree (the runner lays them out: RequestRows in
engine/runner/input_batch.py is one SampleRows). In one pass:
  1. each row's distribution p: Sampler.process (inside Sampler.targets) over all rows at
     once, every row with its own penalty history (the drafts before it on its path, so p is
     exactly what the request would sample from at that position);
  2. each row's target token: argmax for greedy requests, the winner of the race keyed
     (seed, t) for sampled ones (t = the position the row predicts; engine/sample/rng.py);
  3. the one host sync: targets, and the target's top-k ids of every row when a proposer asked
     for them (Token Recycling);
  4. per request on the host: accept drafts equal to the target tokens (verify.py).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from engine.outputs import DraftTree
from engine.request import Request
from engine.sample.rng import race_keys
from engine.sample.sampler import Sampler, SamplingRow
from engine.sample.tree import path_to
from engine.sample.verify import VerifyResult, verify_chain, verify_tree
from kernels.sampling import topk_rows

logger = logging.getLogger(__name__)


class SampleRows(Protocol):
    """One request's sample rows in the step's logits."""

    @property
    def request(self) -> Request: ...

    @property
    def draft_token_ids(self) -> tuple[int, ...]: ...  # chain tokens or tree nodes, row order

    @property
    def tree(self) -> DraftTree | None: ...

    @property
    def logit_rows(self) -> tuple[int, ...]: ...  # [root, drafts...]; empty: no sampling


@dataclass(frozen=True)
class Verified:
    """One request's outcome of the step."""

    token_ids: tuple[int, ...]  # accepted drafts + the correction / bonus token
    num_draft_tokens: int
    num_accepted_tokens: int
    path_rows: tuple[int, ...]  # logits row that predicted each emitted token
    accepted_node_ids: tuple[int, ...]  # tree nodes (chains: draft indices) accepted
    target_topk_ids: tuple[tuple[int, ...], ...] = ()  # per emitted token, when asked for
    draft_topk_ids: tuple[tuple[int, ...], ...] = ()  # per draft row, when asked for
    error: str | None = None  # this request's host-side processing failed (the others go on)


def sampling_row(request: Request, extra_output: Sequence[int] = ()) -> SamplingRow:
    """The sampler's view of a request at the position after output + extra_output tokens."""
    params = request.sampling_params
    needs_history = params.needs_penalties or params.min_tokens > 0
    blocked = ()
    if params.min_tokens > 0:
        eos = () if params.ignore_eos else request.eos_token_ids
        blocked = (*eos, *params.stop_token_ids)
    return SamplingRow(
        params=params,
        output_token_ids=[*request.output_token_ids, *extra_output] if needs_history else (),
        prompt_token_ids=request.prompt_token_ids if params.repetition_penalty != 1 else (),
        stop_ids_blocked=blocked,
    )


def plain_greedy(request: Request) -> bool:
    """The request's rows are greedy with nothing to edit, whatever drafts precede them: what
    Sampler.plain_greedy finds in every row sampling_row() would build for it, read from the
    request alone (min_tokens already reached by its output, so no drafts change that)."""
    params = request.sampling_params
    return (
        params.greedy
        and not params.logit_bias
        and not params.needs_penalties
        and len(request.output_token_ids) >= params.min_tokens
    )


def _histories(rows: SampleRows) -> list[list[int]]:
    """The draft tokens before each of the request's rows, on that row's path."""
    if rows.tree is None:
        drafts = list(rows.draft_token_ids)
        return [drafts[:j] for j in range(len(drafts) + 1)]
    tree = rows.tree
    return [[]] + [
        [tree.token_ids[n] for n in path_to(tree, node)] for node in range(tree.num_nodes)
    ]


def _depths(rows: SampleRows) -> list[int]:
    """How far past the root's successor each row predicts: 0 for the root row."""
    if rows.tree is None:
        return list(range(len(rows.draft_token_ids) + 1))
    return [0, *rows.tree.depths()]


class BatchVerifier:
    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    @torch.inference_mode()
    def verify(
        self, requests: Sequence[SampleRows], logits: torch.Tensor, target_topk: int = 0
    ) -> dict[str, Verified]:
        """logits [num_logit_rows, vocab] f32 of the step; requests without sample rows
        are skipped. target_topk > 0: also report the target's top ids per emitted token."""
        sampling = [rows for rows in requests if rows.logit_rows]
        if not sampling:
            return {}
        device = logits.device
        row_ids = [r for rows in sampling for r in rows.logit_rows]
        step_logits = logits  # every row, in order (a step of decodes): no copy
        if row_ids != list(range(logits.shape[0])):
            step_logits = logits[torch.tensor(row_ids, device=device)]
        bitmask = _grammar_masks(sampling, device)
        if bitmask is None and all(plain_greedy(rows.request) for rows in sampling):
            targets, valid_rows = self.sampler.greedy_targets(step_logits)  # no per-row work
        else:
            rows_params = self._sampling_rows(sampling)
            keys = self._race_keys(sampling, device)
            targets, valid_rows = self.sampler.targets(step_logits, rows_params, bitmask, keys)
        parts = [targets, valid_rows.long()]
        if target_topk > 0:
            parts.append(topk_rows(step_logits, target_topk).flatten())
        host = torch.cat(parts).tolist()  # the step's one host sync
        num_rows = len(targets)
        valid, topk_ids = host[num_rows : 2 * num_rows], host[2 * num_rows :]
        topk = [topk_ids[i * target_topk : (i + 1) * target_topk]
                for i in range(num_rows)] if target_topk > 0 else []  # fmt: skip
        vocab_size = step_logits.shape[-1]
        targets_ok = _row_error(host[:num_rows], valid, vocab_size) is None  # all at once
        results, first = {}, 0
        for rows in sampling:
            span = slice(first, first + len(rows.logit_rows))
            row_error = None if targets_ok else _row_error(host[span], valid[span], vocab_size)
            results[rows.request.request_id] = self._accept_or_fail(
                rows, host[span], topk[span], row_error
            )
            first = span.stop
        return results

    def _accept_or_fail(
        self, rows: SampleRows, targets: list[int], topk, row_error: str | None = None
    ) -> Verified:
        """One request's outcome; its own bad rows or host-side failure fail only it."""
        request_id = rows.request.request_id
        # Failures are logged once, by whoever reports the request (the server, per request).
        if row_error is not None:
            logger.debug("request %s failed in sampling: %s", request_id, row_error)
            return Verified((), 0, 0, (), (), error=row_error)
        try:
            return self._accept(rows, targets, topk)
        except Exception as exc:  # one request's failure must not take the batch down
            logger.debug("request %s failed in verification", request_id, exc_info=exc)
            return Verified((), 0, 0, (), (), error=f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _sampling_rows(sampling: Sequence[SampleRows]) -> list[SamplingRow]:
        return [
            sampling_row(rows.request, history) for rows in sampling for history in _histories(rows)
        ]

    @staticmethod
    def _race_keys(sampling: Sequence[SampleRows], device: torch.device) -> torch.Tensor | None:
        """key(seed, predicted position) per row; None when every request is greedy."""
        if all(rows.request.sampling_params.greedy for rows in sampling):
            return None
        seeds, positions = [], []
        for rows in sampling:
            request = rows.request
            for depth in _depths(rows):
                seeds.append(request.seed or 0)
                positions.append(request.num_tokens + depth)
        return torch.from_numpy(race_keys(seeds, positions)).to(device)

    @staticmethod
    def _accept(rows: SampleRows, targets: list[int], topk: list[list[int]]) -> Verified:
        drafts = rows.draft_token_ids
        if not drafts and not topk:  # a decode row (a chain of none): its target is its token
            return Verified((targets[0],), 0, 0, rows.logit_rows, ())
        result: VerifyResult = (
            verify_tree(rows.tree, targets) if rows.tree else verify_chain(targets, drafts)
        )
        if rows.tree is None:
            local = list(range(result.num_accepted + 1))
        else:
            local = [0, *(1 + node for node in result.accepted_node_ids)]
        return Verified(
            token_ids=result.token_ids,
            num_draft_tokens=len(drafts),
            num_accepted_tokens=result.num_accepted,
            path_rows=tuple(rows.logit_rows[i] for i in local),
            accepted_node_ids=result.accepted_node_ids,
            target_topk_ids=tuple(tuple(topk[i]) for i in local) if topk else (),
            draft_topk_ids=tuple(tuple(row) for row in topk[1:]),
        )


def _grammar_masks(sampling: Sequence[SampleRows], device: torch.device) -> torch.Tensor | None:
    """int32 [num_rows, words]: each grammar request's rows masked by its grammar after the
    drafts before them (engine/structured/matcher.py); other rows allow everything. None when
    no request has a grammar."""
    grammars = [rows.request.grammar for rows in sampling]
    if all(g is None for g in grammars):
        return None
    num_words = next(g.num_words for g in grammars if g is not None)
    parts = []
    for rows, grammar in zip(sampling, grammars):
        if grammar is None:
            parts.append(np.full((len(rows.logit_rows), num_words), -1, dtype=np.int32))
            continue
        if rows.tree is not None:
            raise ValueError("a grammar request was given a draft tree (chains only)")
        parts.append(grammar.masks(rows.draft_token_ids))
    return torch.from_numpy(np.concatenate(parts)).to(device)


def _row_error(targets: list[int], valid: list[int], vocab_size: int) -> str | None:
    """Why a request's sample rows cannot be used, or None. Valid parameters always give a
    distribution (engine/sample/sampler.py), so a bad row points at the model's logits."""
    if not all(valid):
        return "this request's logits or probabilities were not finite; its tokens were dropped"
    bad = [t for t in targets if not 0 <= t < vocab_size]
    if bad:
        return f"sampling produced token ids outside the vocabulary ({bad[:3]})"
    return None
