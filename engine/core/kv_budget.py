"""How a model's KV cache budget splits between the full-attention pool and the sliding-window
layers' pool (engine/core/block_manager.py). Pure Python.

A request in a window layer holds the blocks its step's queries can read: those spanning
[p - W + 1, p + q) for a step of q tokens from position p, at most ceil((W - 1) / B) + 2 +
ceil(q / B) blocks. Over `max_num_seqs` seats and a step of at most `max_num_batched_tokens`
tokens that is at most S * (ceil((W - 1) / B) + 3) + ceil(C / B) blocks: the window pool gets
exactly that, so it never runs out before the full pool does, and the rest of the budget goes
to the full-attention layers. When that would leave the full pool no larger than an unsplit
cache (many seats, a small budget, windows near the context length) the cache is not split.

A model whose every layer slides (Phi-3) spends no memory on the full pool: the window pool
takes the whole budget and the full pool, only tables then, gets every seat's longest request.

A separate draft model mirrors the full pool (a cache block of its own for every full-pool
block, outside this budget), so with one the cache is not split: a larger full pool would grow
the draft's cache with it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_manager import WindowGroup


@dataclass(frozen=True)
class KVSplit:
    num_blocks: int  # the full-attention pool (and what every request's block_ids index)
    window: WindowGroup | None  # the window layers' pool; None: they read block_ids too


def window_blocks_needed(
    window: int, block_size: int, max_num_seqs: int, max_step_tokens: int
) -> int:
    """Window-pool blocks that every seat's reads need at once (the bound above)."""
    per_seat = -(-(window - 1) // block_size) + 3
    return max_num_seqs * per_seat + -(-max_step_tokens // block_size)


def split_kv_cache(
    num_unsplit_blocks: int,
    layer_windows: tuple[int, ...],
    block_size: int,
    max_num_seqs: int,
    max_step_tokens: int,
    max_blocks_per_seq: int,
    mirrored: bool = False,
) -> KVSplit:
    """The pools for a budget worth `num_unsplit_blocks` blocks of every layer; `mirrored`: a
    draft model keeps a cache block for every full-pool block."""
    num_layers = len(layer_windows)
    num_window_layers = sum(1 for w in layer_windows if w > 0)
    num_full_layers = num_layers - num_window_layers
    if num_window_layers == 0 or mirrored:
        return KVSplit(num_unsplit_blocks, None)
    window = max(layer_windows)
    if num_full_layers == 0:
        num_full = max(num_unsplit_blocks, max_num_seqs * max_blocks_per_seq)
        return KVSplit(num_full, WindowGroup(window, num_unsplit_blocks))
    needed = window_blocks_needed(window, block_size, max_num_seqs, max_step_tokens)
    layer_blocks = num_unsplit_blocks * num_layers
    num_full = (layer_blocks - num_window_layers * needed) // num_full_layers
    if num_full <= num_unsplit_blocks or needed >= num_unsplit_blocks:
        return KVSplit(num_unsplit_blocks, None)
    return KVSplit(num_full, WindowGroup(window, needed))
