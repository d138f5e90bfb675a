"""Reference sampling ops (pure PyTorch, CPU + GPU): the slow twins a FlashInfer variant may replace.

Each op works on a batch of rows, every row independent of the others (batch invariance):
    filter_probs(probs, top_k, top_p, min_p) -> probs restricted to the kept tokens, renormalised
    sample_from_probs(probs, uniforms)        -> one token id per row, by inverse CDF at its uniform
    inverse_cdf(probs, uniforms)              -> the token whose CDF interval holds each uniform
Sampling is by inverse CDF: one uniform u per row, token = first i with cdf(i) > u * sum(p), with
the CDF in float64. It costs one random number per row (not one per vocabulary entry) and never
returns a zero-probability token.
"""

from __future__ import annotations

import torch

# top-p looks at a row's best 256 tokens, then 4096, then the whole sorted row, stopping as soon
# as the candidates reach top_p: on one CPU core a 49k-token row takes ~0.2 ms for topk(256)
# against ~4-10 ms for a full sort, and peaked LLM rows rarely need more.
TOP_P_CANDIDATES = (256, 4096)


def inverse_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """probs [..., V] (each row needs positive mass, need not be normalised); uniforms [...] in [0, 1).

    Returns int64 [...]. The scaled target is kept strictly below the total so the search never
    runs past the last positive entry.
    """
    cdf = probs.double().cumsum(dim=-1)
    total = cdf[..., -1:]
    target = torch.minimum(uniforms.double()[..., None] * total, torch.nextafter(total, 0 * total))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def sample_from_probs(probs: torch.Tensor, uniforms: torch.Tensor | None) -> torch.Tensor:
    """probs [N, V], normalised -> [N] int64 token ids, without a host sync.

    Row i takes the inverse CDF at uniforms[i] (float64 [N] in [0, 1)); uniforms None (every
    row greedy) takes each row's argmax. A point mass (a greedy row's one-hot) gives its token
    at any uniform, so greedy and sampled rows can share one call.
    """
    if uniforms is None:
        return probs.argmax(dim=-1)
    return inverse_cdf(probs, uniforms)


def filter_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Keep each row's top-k, then its top-p nucleus, then tokens >= min_p * max; renormalise.

    probs [N, V] f32, normalised. top_k [N] int (<= 0: off), top_p [N] f32 (>= 1: off),
    min_p [N] f32 (0: off); None = off for every row. Pass the parameter tensors on the CPU:
    the kernel reads their maxima on the host. Order follows vLLM / HF: top-p measures mass in
    the top-k-renormalised row and keeps the smallest prefix of it reaching top_p (the crossing
    token stays). Ties at a cut are all kept, so the result never depends on sort order. min-p
    compares with the row's largest probability, which no earlier filter removes.
    """
    keep = torch.ones_like(probs, dtype=torch.bool)
    if top_k is not None and bool((top_k > 0).any()):
        keep &= _top_k_mask(probs, top_k)
    if top_p is not None and bool((top_p < 1).any()):
        keep &= _top_p_mask(probs * keep, top_p)
    if min_p is not None and bool((min_p > 0).any()):
        min_p = min_p.to(device=probs.device, dtype=probs.dtype)
        keep &= probs >= min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    filtered = probs * keep
    return filtered / filtered.sum(dim=-1, keepdim=True)


def _top_k_mask(probs: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    vocab_size = probs.shape[-1]
    k = torch.where(top_k > 0, top_k, vocab_size).clamp(max=vocab_size)
    max_k = int(k[top_k > 0].max())
    values = probs.topk(max_k, dim=-1).values
    k = k.clamp(max=max_k).to(probs.device)
    kth_value = values.gather(-1, (k - 1)[:, None])
    off = (top_k <= 0).to(probs.device)[:, None]
    return (probs >= kth_value) | off


def _top_p_mask(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """probs may be unnormalised (top-k already applied); mass is measured relative to the sum."""
    top_p = top_p.to(device=probs.device, dtype=torch.float64)
    threshold, covered = _top_p_threshold(probs, top_p, TOP_P_CANDIDATES[0])
    rows = (~covered).nonzero().squeeze(-1)
    for num_candidates in (*TOP_P_CANDIDATES[1:], probs.shape[-1]):
        if rows.numel() == 0:
            break
        found, covered = _top_p_threshold(probs[rows], top_p[rows], num_candidates)
        threshold[rows] = found
        rows = rows[~covered]
    off = (top_p >= 1)[:, None]  # "off" must not drop a tail through a cumsum that rounds to 1
    return (probs >= threshold) | off


def _top_p_threshold(
    probs: torch.Tensor, top_p: torch.Tensor, num_candidates: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(smallest kept probability [N, 1], whether the candidates decide the row [N])."""
    num_candidates = min(num_candidates, probs.shape[-1])
    values = probs.topk(num_candidates, dim=-1).values.double()  # descending
    total = probs.sum(dim=-1, keepdim=True, dtype=torch.float64)
    cumulative = values.cumsum(dim=-1) / total
    num_kept = (cumulative - values / total < top_p[:, None]).sum(dim=-1, keepdim=True)
    # Candidates decide the row when the first token after them is already past the nucleus.
    covered = (cumulative[:, -1] >= top_p) | (top_p >= 1) | (num_candidates == probs.shape[-1])
    return values.gather(-1, num_kept - 1).to(probs.dtype), covered
