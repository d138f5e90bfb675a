"""Reference sampling ops (pure PyTorch, CPU + GPU): the slow twins a FlashInfer variant may replace.

Two ops, each on a batch of rows, each row independent of the others (batch invariance):
    filter_probs(probs, top_k, top_p, min_p) -> probs restricted to the kept tokens, renormalised
    sample_from_probs(probs, generators)      -> one token id per row, drawn with that row's RNG
Sampling uses the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) i.i.d. picks token i with
probability p_i / sum(p), so a row's token depends only on its probabilities and its generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def exponential_noise(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Exp(1) draws, clamped away from 0 so that p / E never divides zero by zero (NaN wins argmax)."""
    noise = torch.empty(shape, dtype=torch.float32, device=device).exponential_(generator=generator)
    return noise.clamp_(min=torch.finfo(torch.float32).tiny)


def sample_from_probs(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """probs [N, V] (rows need not be normalised, each needs one positive entry) -> [N] int64.

    Row i draws its noise from generators[i]; rows whose generator is None share one draw from the
    global RNG. Point-mass rows (greedy) skip the noise and keep the generator untouched.
    """
    num_rows, vocab_size = probs.shape
    tokens = probs.argmax(dim=-1)
    is_point = ((probs > 0).sum(dim=-1) == 1).tolist()
    unseeded = [i for i in range(num_rows) if not is_point[i] and generators[i] is None]
    if unseeded:
        index = torch.tensor(unseeded, device=probs.device)
        noise = exponential_noise((len(unseeded), vocab_size), None, probs.device)
        tokens[index] = (probs[index] / noise).argmax(dim=-1)
    for i in range(num_rows):
        if not is_point[i] and generators[i] is not None:
            noise = exponential_noise((vocab_size,), generators[i], probs.device)
            tokens[i] = (probs[i] / noise).argmax()
    return tokens


def filter_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Keep each row's top-k, then its top-p nucleus, then tokens >= min_p * max; renormalise.

    probs [N, V] f32, normalised. top_k [N] int (<= 0: off), top_p [N] f32 (>= 1: off),
    min_p [N] f32 (0: off); None = off for every row. Order and tie rules follow vLLM / HF:
    top-k keeps exactly k tokens (ties broken towards the lower token id by a stable sort);
    top-p keeps the smallest prefix of the sorted, top-k-renormalised row whose mass reaches
    top_p (the token that crosses it stays); min-p compares with the row's largest probability,
    which no earlier filter removes, so renormalisation does not change its threshold.
    """
    num_rows, vocab_size = probs.shape
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
    keep = torch.ones_like(sorted_probs, dtype=torch.bool)
    if top_k is not None:
        ranks = torch.arange(vocab_size, device=probs.device)
        k = torch.where(top_k > 0, top_k, vocab_size).to(probs.device)
        keep &= ranks < k[:, None]
    if top_p is not None:
        kept = sorted_probs * keep
        kept = kept / kept.sum(dim=-1, keepdim=True)
        mass_before = kept.cumsum(dim=-1) - kept
        top_p = top_p.to(device=probs.device, dtype=probs.dtype)
        # top_p == 1 is "off": float rounding must not drop the tail through a cumsum that hits 1.
        keep &= (mass_before < top_p[:, None]) | (top_p[:, None] >= 1)
    if min_p is not None:
        min_p = min_p.to(device=probs.device, dtype=probs.dtype)
        keep &= sorted_probs >= min_p[:, None] * sorted_probs[:, :1]
    mask = torch.zeros_like(keep).scatter_(-1, order, keep)
    filtered = probs * mask
    return filtered / filtered.sum(dim=-1, keepdim=True)
