"""BlockManager: the paged KV cache's bookkeeping (DESIGN §4). Pure Python, no torch.

A pool of `num_total_blocks` blocks of `block_size` token slots (engine/core/block_pool.py); a
request owns the ordered list `request.block_ids` and token position p lives in slot
block_ids[p // block_size] * block_size + p % block_size. Blocks are reference counted:
prefix-cache hits and n > 1 forks share blocks, and a shared block that a request must write
into is copied first (copy-on-write).

Sliding-window layers (a `WindowGroup`) keep their K/V in a pool of their own, through a second
table `request.window_block_ids` indexed like `block_ids`. A query at position p in a layer of
window W reads keys p - W + 1 .. p only, so once a step's first query sits at p every block
ending before p - W + 1 is never read again: it is released and its entry becomes NULL_BLOCK.
A request so holds about (W + its step's tokens) / block_size window blocks however long it
grows, and the window pool is sized for that (engine/core/kv_budget.py). The full pool still
holds every position (the full-attention layers, the draft model's mirrored cache, the prefix
hashes).

Invariants: ref_count(b) == number of live table entries holding b, per pool; only blocks fully
covered by a request's num_computed_tokens (verified tokens) are ever registered in the prefix
cache; a window table's entries from its first visible block on are never NULL.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.core.block_pool import NULL_BLOCK, BlockCopy, BlockPool
from engine.request import Request

__all__ = ["NULL_BLOCK", "BlockCopy", "BlockManager", "SharedBlocks", "WindowGroup"]


@dataclass(frozen=True)
class WindowGroup:
    """The sliding-window layers' pool: `window` is the largest of their windows."""

    window: int
    num_blocks: int


class SharedBlocks(NamedTuple):
    """Blocks a request adopts when admitted (prefix-cache hits or an n > 1 parent's prompt
    blocks), in the full pool and (NULL before the window) in the window pool."""

    block_ids: Sequence[int]
    window_block_ids: Sequence[int] = ()


@dataclass
class _TablePlan:
    """What allocate_slots will do to one table; nothing is changed until every table fits."""

    table: list[int]  # the request's table, or the adopted one
    adopted: list[int] = field(default_factory=list)
    num_new_blocks: int = 0
    to_copy: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)  # indices that slide out of the window


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        window: WindowGroup | None = None,
    ) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._pool = BlockPool(num_blocks, block_size)
        self._window_pool = BlockPool(window.num_blocks, block_size) if window else None
        self.window = window.window if window else 0
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of which found

    # ---- counters --------------------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return self._pool.num_total_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._pool.num_free_blocks

    @property
    def usage(self) -> float:
        """The fuller pool's share of used blocks."""
        pools = [self._pool] + ([self._window_pool] if self._window_pool else [])
        return max(pool.usage for pool in pools)

    @property
    def num_cached_blocks(self) -> int:
        return self._pool.prefix.num_cached_blocks

    @property
    def window_pool(self) -> BlockPool | None:
        """The sliding-window layers' pool (None: every layer reads `block_ids`)."""
        return self._window_pool

    def ref_count(self, block_id: int) -> int:
        return self._pool.ref_count(block_id)

    def free_block_ids(self) -> list[int]:
        """Free blocks in allocation order (fresh first, then cached LRU-first)."""
        return self._pool.free_block_ids()

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def first_visible_block(self, position: int) -> int:
        """The first block a query at `position` (or after) reads in the window layers."""
        return max(0, position - self.window + 1) // self.block_size

    # ---- prefix cache ----------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> SharedBlocks:
        """Cached blocks matching the request's leading full token blocks. Never the block
        holding the last token: that token is recomputed to produce the next logits. With a
        window pool the hit is the longest whose window blocks are cached too. Pure."""
        if not self.enable_prefix_caching:
            return SharedBlocks([])
        num_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._pool.prefix.request_hashes(request, num_blocks)
        hits = self._pool.prefix.lookup(hashes)
        if self._window_pool is None:
            return SharedBlocks(hits)
        window_hits = [self._window_pool.prefix.block_of(h) for h in hashes[: len(hits)]]
        for num_hit in range(len(hits), 0, -1):
            first = self.first_visible_block(num_hit * self.block_size)
            window = window_hits[first:num_hit]
            if NULL_BLOCK not in window and None not in window:
                return SharedBlocks(hits[:num_hit], [NULL_BLOCK] * first + window)
        return SharedBlocks([])

    def fork_blocks(self, parent: Request, num_tokens: int) -> SharedBlocks | None:
        """The parent's blocks for its first `num_tokens` positions, for a child that computes
        from position num_tokens - 1; None when the parent's window has slid past them."""
        num_blocks = self.num_blocks_for(num_tokens)
        if self._window_pool is None:
            return SharedBlocks(parent.block_ids[:num_blocks])
        first = self.first_visible_block(num_tokens - 1)
        window = parent.window_block_ids[first:num_blocks]
        if NULL_BLOCK in window or len(window) < num_blocks - first:
            return None
        return SharedBlocks(parent.block_ids[:num_blocks], [NULL_BLOCK] * first + window)

    def record_prefix_query(self, num_query_tokens: int, num_hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.prefix_cache_queries += num_query_tokens
            self.prefix_cache_hits += num_hit_tokens

    def cache_full_blocks(self, request: Request) -> None:
        """Register the request's blocks fully covered by verified, computed tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
        start = request.num_hashed_blocks
        if num_full <= start:
            return
        hashes = self._pool.prefix.request_hashes(request, num_full)
        for index in range(start, num_full):
            self._pool.prefix.register(request.block_ids[index], hashes[index])
        if self._window_pool is not None:
            for index in range(start, num_full):
                block_id = request.window_block_ids[index]
                if block_id != NULL_BLOCK:
                    self._window_pool.prefix.register(block_id, hashes[index])
        request.num_hashed_blocks = num_full

    # ---- allocation ------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_computed_tokens: int,
        num_new_tokens: int,
        shared: SharedBlocks | None = None,
    ) -> list[BlockCopy] | None:
        """Give the request slots for positions [0, num_computed_tokens + num_new_tokens).

        `shared` blocks (prefix-cache hits or a parent's blocks; only for a request holding
        none yet) are adopted first. Every shared block (ref count > 1) in the write range
        [num_computed_tokens, end) is copied to a private block; the copies are returned.
        Window blocks before the first query's window are released. All or nothing: None,
        with no state changed, when the free blocks do not suffice.
        """
        if shared is not None and shared.block_ids and request.block_ids:
            raise ValueError(f"request {request.request_id} already holds blocks")
        if shared is None and self._holds(request, num_computed_tokens, num_new_tokens):
            return []
        adopt = shared is not None and bool(shared.block_ids)
        span = (num_computed_tokens, num_computed_tokens + num_new_tokens)
        if adopt:
            table = list(shared.block_ids)
            full = self._plan(self._pool, table, list(table), *span)
        else:
            full = self._plan(self._pool, request.block_ids, [], *span)
        plans = [(self._pool, full)]
        if self._window_pool is not None:
            window = self._plan_window(request, shared if adopt else None, *span)
            plans.append((self._window_pool, window))
        if not all(self._fits(pool, plan) for pool, plan in plans):
            return None
        copies = self._apply(self._pool, full, False)
        request.block_ids = full.table
        if self._window_pool is not None:
            copies += self._apply(self._window_pool, window, True)
            request.window_block_ids = window.table
        return copies

    def _holds(self, request: Request, num_computed_tokens: int, num_new_tokens: int) -> bool:
        """The request's own blocks already hold the written span, none of them shared, and
        no window pool releases any (most decode steps): nothing to allocate or copy."""
        table = request.block_ids
        last = self.num_blocks_for(num_computed_tokens + num_new_tokens)
        if self._window_pool is not None or num_new_tokens <= 0 or last > len(table):
            return False
        pool = self._pool
        first = num_computed_tokens // self.block_size
        if last - first == 1:  # a decode step writes into one block
            return pool.ref_count(table[first]) == 1
        return all(pool.ref_count(table[i]) == 1 for i in range(first, last))

    def _plan(
        self, pool: BlockPool, table: list[int], adopted: list[int], num_computed: int, end: int
    ) -> _TablePlan:
        num_blocks = self.num_blocks_for(end)
        first_written = num_computed // self.block_size if end > num_computed else num_blocks
        written = range(first_written, min(len(table), num_blocks))
        return _TablePlan(
            table,
            adopted,
            max(0, num_blocks - len(table)),
            pool.shared_indices(table, adopted, written),
        )

    def _plan_window(
        self, request: Request, shared: SharedBlocks | None, num_computed: int, end: int
    ) -> _TablePlan:
        first = self.first_visible_block(num_computed)
        if shared is not None:  # what slid out of the window is not adopted at all
            adopted = list(shared.window_block_ids[first:])
            table = [NULL_BLOCK] * first + adopted
            return self._plan(self._window_pool, table, adopted, num_computed, end)
        table = request.window_block_ids
        plan = self._plan(self._window_pool, table, [], num_computed, end)
        plan.released = [i for i in range(min(first, len(table))) if table[i] != NULL_BLOCK]
        return plan

    @staticmethod
    def _fits(pool: BlockPool, plan: _TablePlan) -> bool:
        freed = sum(1 for i in plan.released if pool.ref_count(plan.table[i]) == 1)
        needed = plan.num_new_blocks + len(plan.to_copy)
        revived = pool.num_revived(plan.adopted) if plan.adopted else 0
        return needed <= pool.num_free_blocks - revived + freed

    @staticmethod
    def _apply(pool: BlockPool, plan: _TablePlan, window: bool) -> list[BlockCopy]:
        table = plan.table
        for block_id in plan.adopted:
            pool.acquire(block_id)
        for index in plan.released:
            pool.release(table[index])
            table[index] = NULL_BLOCK
        copies = [BlockCopy(*pool.copy_on_write(table, i), window) for i in plan.to_copy]
        table.extend(pool.allocate() for _ in range(plan.num_new_blocks))
        return copies

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the request's blocks lying wholly beyond its first `num_tokens` positions
        (draft slots that verification rejected)."""
        keep = self.num_blocks_for(num_tokens)
        while len(request.block_ids) > keep:
            self._pool.release(request.block_ids.pop())
        if self._window_pool is not None:
            while len(request.window_block_ids) > keep:
                self._release_window(request.window_block_ids.pop())

    def free(self, request: Request) -> None:
        """Release all the request's blocks, first indexing its verified full blocks so that a
        later request (or this one, resumed) can reuse them. Safe to call twice."""
        self.cache_full_blocks(request)
        # Tail first: a request's last blocks are the least likely to be shared by a future
        # prompt, so they should be evicted before its leading ones.
        for block_id in reversed(request.block_ids):
            self._pool.release(block_id)
        for block_id in reversed(request.window_block_ids):
            self._release_window(block_id)
        request.block_ids = []
        request.window_block_ids = []
        request.num_hashed_blocks = 0

    def _release_window(self, block_id: int) -> None:
        if block_id != NULL_BLOCK:
            self._window_pool.release(block_id)
