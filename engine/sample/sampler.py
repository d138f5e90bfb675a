"""Sampler: logits rows -> each request's next-token distribution -> tokens, plus logprobs.

process() applies, in this order (vLLM / OpenAI semantics):
    0. structured output: tokens a request's grammar forbids get -inf (a bitmask per row,
       engine/structured/matcher.py)
    1. logit_bias (added to the logits)
    2. min_tokens: the row's stop ids (EOS + stop_token_ids) get -inf while fewer than
       min_tokens tokens precede this position
    3. repetition_penalty over prompt + output tokens (HF/vLLM: positive logits divided,
       negative multiplied); presence / frequency penalties over output tokens only
    4. greedy rows (temperature below GREEDY_TEMPERATURE): a one-hot point mass on the
       processed argmax (ties: the lowest token id); other rows: softmax(logits / temperature),
       then top-k (clamped to the vocabulary), top-p, min-p.
The result is float32 probabilities, the `p` that speculative verification compares drafts
against. A row's result depends only on its own logits and parameters (batch invariance);
sample() draws each row's token by an exponential race (Gumbel-max) keyed by the request's seed
and the token's position (engine/sample/rng.py, kernels/sampling.py). For valid SamplingParams and finite
logits every row is a distribution; valid_rows() tells, per row and without a host sync,
whether that held (a non-finite logit from the model breaks only its own row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.outputs import TokenLogprobs
from engine.sampling_params import SamplingParams
from kernels.sampling import argmax_rows, filter_probs, sample_from_probs


@dataclass(frozen=True)
class SamplingRow:
    """What the sampler needs to know about one logits row besides the logits."""

    params: SamplingParams
    output_token_ids: Sequence[int] = ()  # generated before this row's position (incl. drafts)
    prompt_token_ids: Sequence[int] = ()  # repetition_penalty covers prompt + output
    stop_ids_blocked: tuple[int, ...] = ()  # EOS + stop_token_ids, masked before min_tokens

    @property
    def blocks_stop_ids(self) -> bool:
        return bool(self.stop_ids_blocked) and len(self.output_token_ids) < self.params.min_tokens

    @property
    def needs_logit_edits(self) -> bool:
        """True when steps 1-3 change this row's logits (the slow, per-row path)."""
        return bool(self.params.logit_bias) or self.params.needs_penalties or self.blocks_stop_ids


class Sampler:
    """Stateless; one instance per model runner."""

    def process(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        bitmask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """logits [N, V] -> probabilities [N, V] f32 (one-hot for greedy rows).
        bitmask: int32 [N, ceil(V / 32)], bit t % 32 of word t // 32 allows token t; None:
        no row has a grammar."""
        if len(rows) != logits.shape[0]:
            raise ValueError(f"got {logits.shape[0]} logits rows but {len(rows)} sampling rows")
        logits = logits.float()
        edits = any(row.needs_logit_edits for row in rows)
        if edits or bitmask is not None:
            logits = logits.clone()
        if bitmask is not None:
            apply_bitmask(logits, bitmask)
        if edits:
            for i, row in enumerate(rows):
                if row.needs_logit_edits:
                    _edit_logits(logits[i], row)
        greedy = [row.params.greedy for row in rows]
        if all(greedy):  # the common fast path: one batched argmax, no per-row work
            return _one_hot(argmax_rows(logits), logits.shape[-1])
        if not any(greedy):
            return _random_rows_probs(logits, [row.params for row in rows])
        probs = torch.empty_like(logits)
        greedy_index = [i for i, g in enumerate(greedy) if g]
        random_index = [i for i, g in enumerate(greedy) if not g]
        index = torch.tensor(greedy_index, device=logits.device)
        probs[index] = _one_hot(argmax_rows(logits[index]), logits.shape[-1])
        index = torch.tensor(random_index, device=logits.device)
        probs[index] = _random_rows_probs(logits[index], [rows[i].params for i in random_index])
        return probs

    def targets(
        self,
        logits: torch.Tensor,
        rows: Sequence[SamplingRow],
        bitmask: torch.Tensor | None,
        keys: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(token [N], valid [N] bool) per row, on the device: process(), sample() and
        valid_rows(), or greedy_targets()' one reduction when every row is plain greedy."""
        if self.plain_greedy(rows, bitmask):
            return self.greedy_targets(logits)
        probs = self.process(logits, rows, bitmask)
        return self.sample(probs, keys), self.valid_rows(logits, probs)

    @staticmethod
    def plain_greedy(rows: Sequence[SamplingRow], bitmask: torch.Tensor | None) -> bool:
        """Every row greedy with nothing to edit: greedy_targets() gives process() + sample()
        + valid_rows()'s answer without building the one-hot rows."""
        return bitmask is None and all(r.params.greedy and not r.needs_logit_edits for r in rows)

    @staticmethod
    def greedy_targets(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(argmax [N], valid [N] bool) of plain greedy rows: the first maximal logit's index,
        and the row invalid where its logit there is not finite (NaN is maximal, so a NaN or an
        inf anywhere in a row lands there). On a GPU one max reduction gives both (max's
        index is the first maximal one, as argmax's)."""
        logits = logits.float()
        if logits.device.type != "cpu":
            best, targets = logits.max(dim=-1)
            return targets, torch.isfinite(best)
        targets = argmax_rows(logits)
        best = logits.gather(-1, targets.to(logits.device)[:, None]).squeeze(-1)
        return targets, torch.isfinite(best)

    @staticmethod
    def valid_rows(logits: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
        """bool [N]: row i came from finite logits and is a distribution (positive, finite
        mass). Two reductions on the device, no sync: amax and sum propagate NaN and inf, and
        a greedy row's one-hot hides a NaN logit that only its amax still shows."""
        total = probs.sum(dim=-1)
        return torch.isfinite(logits.amax(dim=-1)) & torch.isfinite(total) & (total > 0)

    def sample(self, probs: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
        """One token per row of process()'s output, on the device (no host sync): the winner
        of the race keyed keys[i] (int64 [N], engine/sample/rng.py), or the argmax when keys
        is None."""
        if keys is not None and keys.shape[0] != probs.shape[0]:
            raise ValueError(f"got {probs.shape[0]} rows but {keys.shape[0]} race keys")
        return sample_from_probs(probs, keys)

    def logprobs(
        self, logits: torch.Tensor, token_ids: Sequence[int], num_top: Sequence[int]
    ) -> list[TokenLogprobs]:
        """Logprobs from the raw model logits (before any sampling transform), as OpenAI reports.

        logits [N, V]; row i scores token_ids[i] and lists its num_top[i] best tokens, best first.
        """
        if not token_ids:
            return []
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        index = torch.tensor(list(token_ids), dtype=torch.long, device=logits.device)[:, None]
        chosen = logprobs.gather(-1, index).squeeze(-1).tolist()
        max_top = max(num_top, default=0)
        top_values: list[list[float]] = [[] for _ in token_ids]
        top_ids: list[list[int]] = [[] for _ in token_ids]
        if max_top > 0:
            top = logprobs.topk(min(max_top, logits.shape[-1]), dim=-1)
            top_values, top_ids = top.values.tolist(), top.indices.tolist()
        return [
            TokenLogprobs(
                token_id=int(token_id),
                logprob=chosen[i],
                top=tuple(zip(top_ids[i][: num_top[i]], top_values[i][: num_top[i]])),
            )
            for i, token_id in enumerate(token_ids)
        ]


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """In place: -inf where the row's bitmask (int32 [N, W]) has a 0 bit; tokens beyond 32 * W
    are forbidden."""
    num_rows, vocab_size = logits.shape
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask[:, :, None] >> bits) & 1).bool().reshape(num_rows, -1)
    if allowed.shape[1] < vocab_size:
        allowed = torch.nn.functional.pad(allowed, (0, vocab_size - allowed.shape[1]))
    logits.masked_fill_(~allowed[:, :vocab_size].to(logits.device), float("-inf"))


def _one_hot(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    probs = torch.zeros(token_ids.shape[0], vocab_size, device=token_ids.device)
    return probs.scatter_(-1, token_ids[:, None], 1.0)


def _edit_logits(row_logits: torch.Tensor, row: SamplingRow) -> None:
    """Steps 1-3 of the module docstring, in place on one row [V]."""
    params, vocab_size, device = row.params, row_logits.shape[0], row_logits.device
    if params.logit_bias:
        # Ids beyond the model's vocabulary are ignored; the server validates them.
        bias = [(t, b) for t, b in params.logit_bias.items() if 0 <= t < vocab_size]
        if bias:
            ids = torch.tensor([t for t, _ in bias], device=device)
            row_logits[ids] += torch.tensor([b for _, b in bias], device=device)
    if row.blocks_stop_ids:
        ids = [t for t in row.stop_ids_blocked if 0 <= t < vocab_size]
        row_logits[torch.tensor(ids, dtype=torch.long, device=device)] = float("-inf")
    if params.repetition_penalty != 1:
        seen = list(row.prompt_token_ids) + list(row.output_token_ids)
        if seen:
            ids = torch.tensor(seen, device=device).unique()
            values = row_logits[ids]
            penalty = params.repetition_penalty
            row_logits[ids] = torch.where(values > 0, values / penalty, values * penalty)
    if (params.presence_penalty or params.frequency_penalty) and row.output_token_ids:
        ids, counts = torch.tensor(list(row.output_token_ids), device=device).unique(
            return_counts=True
        )
        row_logits[ids] -= params.frequency_penalty * counts + params.presence_penalty


def _random_rows_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
    """Temperature, softmax, then top-k / top-p / min-p (only when some row asks for one)."""
    device = logits.device
    temperature = torch.tensor([p.temperature for p in params], device=device)
    probs = torch.softmax(logits / temperature[:, None], dim=-1)
    filtered = [i for i, p in enumerate(params) if p.top_k > 0 or p.top_p < 1 or p.min_p > 0]
    if not filtered:
        return probs
    vocab_size = logits.shape[-1]
    if len(filtered) == len(params):
        return filter_probs(probs, **_filter_args(params, vocab_size))
    index = torch.tensor(filtered, device=device)
    subset = [params[i] for i in filtered]
    probs[index] = filter_probs(probs[index], **_filter_args(subset, vocab_size))
    return probs


# top-p below a row's largest probability keeps just its best token(s); that probability is at
# least 1/vocab, so this floor changes nothing below a million tokens, and keeps a tiny top_p
# from rounding to 0 in float32 (which would keep no token at all).
_MIN_TOP_P = 1e-6


def _filter_args(params: Sequence[SamplingParams], vocab_size: int) -> dict[str, torch.Tensor]:
    # Parameter tensors stay on the CPU: the kernel reads their maxima without a device sync.
    # top_k beyond the vocabulary keeps everything, as the vocabulary size does.
    return {
        "top_k": torch.tensor([min(p.top_k, vocab_size) for p in params]),
        "top_p": torch.tensor([max(p.top_p, _MIN_TOP_P) for p in params]),
        "min_p": torch.tensor([p.min_p for p in params]),
    }
