"""FlashInfer sampling kernels (CUDA) behind small functions, and the rule for when not to use them.

- sample_top_k_top_p: one fused rejection-sampling kernel for a batch of rows with per-row
  top-k / top-p, no sort (FlashInfer's top_k_top_p_sampling_from_probs).
- chain_speculative_sample: lossless verification of draft chains (Leviathan et al. 2023:
  accept x with probability min(1, p(x)/q(x)), else sample normalize(max(p - q, 0)), bonus
  token after a fully accepted chain) in one kernel. FlashInfer has no tree kernel: trees are
  verified by our own torch code (engine/speculation/verify.py).

Where the torch path is forced (torch_sampling_reason):
- a request with a per-request seed. Its tokens must not depend on which other requests share
  the batch nor on the backend; FlashInfer draws from one generator (or per-row seed/offset)
  with its own rejection scheme, so the random stream differs from the torch sampler's and a
  seeded request would change tokens when batched differently. Seeded rows go to torch.
- min_p > 0: no fused kernel combines min-p with top-k/top-p.
- not on CUDA, or flashinfer does not import.
Greedy rows (temperature 0) are an argmax and never need a kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def torch_sampling_reason(
    seeds: Sequence[int | None], min_ps: Sequence[float], device: torch.device
) -> str | None:
    """Why these rows must use the torch sampler, or None when FlashInfer may sample them."""
    if device.type != "cuda":
        return f"device {device} is not CUDA"
    if any(seed is not None for seed in seeds):
        return "a request has a per-request seed (its stream must not depend on the batch)"
    if any(min_p > 0 for min_p in min_ps):
        return "min_p > 0 has no fused FlashInfer kernel"
    try:
        import flashinfer.sampling  # noqa: F401
    except Exception as exc:  # ImportError, or a CUDA/JIT error raised at import time
        return f"flashinfer does not import ({exc})"
    return None


def top_k_tensor(top_ks: Sequence[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """[B] int32 per-row top-k; SamplingParams' 0 / -1 (off) becomes the whole vocabulary."""
    values = [k if 0 < k < vocab_size else vocab_size for k in top_ks]
    return torch.tensor(values, dtype=torch.int32, device=device)


def sample_top_k_top_p(
    probs: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """probs [B, V] float32 (after temperature); top_k [B] int32; top_p [B] float32.

    Returns [B] int64 token ids. Top-k is applied first, then top-p within it (the torch
    sampler's order).
    """
    from flashinfer.sampling import top_k_top_p_sampling_from_probs

    samples = top_k_top_p_sampling_from_probs(
        probs.float().contiguous(),
        top_k,
        top_p.float(),
        filter_apply_order="top_k_first",
        deterministic=True,
        generator=generator,
    )
    return samples.long()


def point_mass_draft_probs(draft_token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q for a deterministic proposer (n-gram): a point mass on each draft token.

    draft_token_ids [B, k] -> [B, k, V] float32. With it the chain rule accepts x with
    probability p(x) and resamples from p with x removed, which is exactly lossless.
    """
    probs = torch.zeros(*draft_token_ids.shape, vocab_size, device=draft_token_ids.device)
    return probs.scatter_(-1, draft_token_ids.long().unsqueeze(-1), 1.0)


def chain_speculative_sample(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify draft chains of equal length k in one kernel.

    draft_probs [B, k, V] float32, draft_token_ids [B, k], target_probs [B, k + 1, V] float32
    (the same temperature / top-k / top-p applied to both). Returns (token_ids [B, k + 1]
    int64, -1 after the last emitted token; num_accepted [B] int64 drafts accepted, so request
    b emits token_ids[b, : num_accepted[b] + 1]).
    """
    from flashinfer.sampling import chain_speculative_sampling

    batch = draft_probs.shape[0]
    accepted_any = torch.zeros(batch, dtype=torch.int32, device=draft_probs.device)
    emitted = torch.zeros(batch, dtype=torch.int32, device=draft_probs.device)
    token_ids, _, emitted = chain_speculative_sampling(
        draft_probs.float().contiguous(),
        draft_token_ids.to(torch.int32).contiguous(),
        target_probs.float().contiguous(),
        maybe_output_accepted_token_num=accepted_any,
        maybe_output_emitted_draft_token_num=emitted,
        deterministic=True,
        generator=generator,
    )
    return token_ids.long(), emitted.long()
