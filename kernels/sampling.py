"""Reference sampling ops (PyTorch, CPU + GPU; numpy's argmax on CPU): the slow twins a FlashInfer
variant may replace.

Each op works on a batch of rows, every row independent of the others (batch invariance):
    argmax_rows(x)                            -> each row's first maximal index (NaN counts as
                                                 maximal), as torch.argmax
    topk_rows(x, k)                           -> each row's k largest entries' indices
    filter_probs(probs, top_k, top_p, min_p) -> probs restricted to the kept tokens, renormalised
    sample_from_probs(probs, keys)            -> one token id per row, by the exponential race
    race_topk(probs, keys, k)                 -> each row's first k finishers of the same race
    race_uniforms(keys, vocab_size)           -> the race's uniform of every token of each row
Sampling is an exponential race (Gumbel-max): token x runs E(x) = -log u(x) with u(x) a
counter-based uniform of (row key, x), the row key a hash of the request's seed and the token's
position (engine/sample/rng.py), and the token with the largest p(x) / E(x) wins, which is
argmax log p(x) + Gumbel(x): a sample of p. Masked tokens (p = 0) never win. The first k
finishers are a sample of k tokens without replacement (Gumbel-top-k). Two distributions raced
with the same noise pick the same token with probability >= (1 - TV) / (1 + TV) (Daliri, Musco
& Suresh 2025): the coupling speculative verification relies on (engine/sample/verify.py).

u(x) = (splitmix64(key ^ x * golden) >> 41 + 0.5) / 2^23, float32: the native CPU kernel
(kernels/cpu/csrc/race.cpp) and the PyTorch twin here compute the same bits; CUDA tensors use
the twin on the device.
"""

from __future__ import annotations

import torch

from kernels.cpu.build import load_native

# top-p looks at a row's best 256 tokens, then 4096, then the whole sorted row, stopping as soon
# as the candidates reach top_p: on one CPU core a 49k-token row takes ~0.2 ms for topk(256)
# against ~4-10 ms for a full sort, and peaked LLM rows rarely need more.
TOP_P_CANDIDATES = (256, 4096)

# SplitMix64 constants (Steele, Lea & Flood 2014) as int64 bit patterns: torch has no uint64
# arithmetic, and int64 multiplication wraps like uint64's.
_GOLDEN = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)
_UNIFORM_BITS = 23  # float32 holds (bits + 0.5) / 2^23 exactly


def race_uniforms(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """keys int64 [N] -> float32 [N, vocab_size] in (0, 1), on keys' device: u(key_i, x)."""
    _check_keys(keys)
    if keys.device.type == "cpu":
        ops = load_native()
        if ops is not None:
            return ops.race_uniforms(keys.contiguous(), vocab_size)
    return race_uniforms_torch(keys, vocab_size)


def race_uniforms_torch(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """race_uniforms in PyTorch on any device (the native kernel's twin, bit for bit)."""
    _check_keys(keys)
    tokens = torch.arange(vocab_size, dtype=torch.int64, device=keys.device)
    bits = _splitmix64(keys[:, None] ^ (tokens * _GOLDEN))
    top = _shift_right(bits, 64 - _UNIFORM_BITS)
    return (top.float() + 0.5) * (1.0 / (1 << _UNIFORM_BITS))


def _check_keys(keys: torch.Tensor) -> None:
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise ValueError(f"race keys must be int64 [N] (engine/sample/rng.py), got {keys.dtype}")


def _shift_right(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (>> on int64 copies the sign bit)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _splitmix64(x: torch.Tensor) -> torch.Tensor:
    x = x + _GOLDEN
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def race_scores(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """probs [N, V] (need not be normalised), keys int64 [N] -> float32 [N, V]: p(x) / E(x),
    0 where p(x) = 0. Larger finishes first."""
    uniforms = race_uniforms(keys.to(probs.device), probs.shape[-1])
    return probs.float() / -torch.log(uniforms)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [N, V] -> int64 [N]: torch.argmax(x, dim=-1) (the first maximal index; the first NaN
    where a row has one). A float32 CPU tensor takes numpy's vectorised argmax, ~10x torch's
    on a 152k-token row (0.017 against 0.197 ms, benchmarks/race_cost.py)."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2:
        return torch.from_numpy(x.detach().contiguous().numpy().argmax(axis=-1).astype("int64"))
    return x.argmax(dim=-1)


def topk_rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """x [N, V] -> int64 [N, k]: each row's k largest entries' indices, largest first, as
    torch.topk(x, k).indices (ties: the lower index first, where torch leaves the order open).
    A float32 CPU tensor takes the native kernel (kernels/cpu/csrc/topk.cpp), ~0.01 ms a
    152k-token row with AVX2 against torch's ~0.2 ms."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and 0 < k <= 256:
        ops = load_native()
        if ops is not None and k <= x.shape[-1]:
            return ops.topk_rows(x.detach().contiguous(), k)
    return x.topk(k, dim=-1).indices


def sample_from_probs(probs: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor:
    """probs [N, V] -> [N] int64 token ids, without a host sync.

    Row i is won by the race keyed keys[i] (int64 [N], engine/sample/rng.py); keys None (every
    row greedy) takes each row's argmax. A point mass (a greedy row's one-hot) wins its own
    race, so greedy and sampled rows can share one call.
    """
    if keys is None:
        return argmax_rows(probs)
    return argmax_rows(race_scores(probs, keys))


def race_topk(probs: torch.Tensor, keys: torch.Tensor, k: int) -> torch.Tensor:
    """The first k finishers of each row's race, first first: int64 [N, k] (Gumbel-top-k, a
    sample without replacement; its first is sample_from_probs's token). k <= V."""
    return race_scores(probs, keys).topk(k, dim=-1).indices


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
