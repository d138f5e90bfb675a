"""BlockManager: the paged KV cache's bookkeeping (DESIGN §4). Pure Python, no torch.

A pool of `num_total_blocks` blocks of `block_size` token slots; a request owns the ordered list
`request.block_ids` and token position p lives in slot block_ids[p // block_size] * block_size +
p % block_size. Blocks are reference counted: prefix-cache hits and n > 1 forks share blocks, and
a shared block that a request must write into is copied first (copy-on-write).

Free blocks sit in two lists. `_fresh_free` holds blocks with no reusable content; `_cached_free`
holds freed blocks still indexed by the prefix cache, least recently freed first. Allocation takes
a fresh block and evicts a cached one (LRU) only when no fresh block is left, so cached prefixes
live as long as possible. Both lists count as free: num_free_blocks = len(fresh) + len(cached).

Invariants: ref_count(b) == number of live requests whose block_ids contain b; a block is in
exactly one free list iff its ref count is 0; only blocks fully covered by a request's
num_computed_tokens (verified tokens) are ever registered in the prefix cache.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence

from engine.core.prefix_cache import PrefixCache
from engine.request import Request

BlockCopy = tuple[int, int]  # (src_block_id, dst_block_id), run before the step's forward


class BlockManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True
    ) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.block_size = block_size
        self.num_total_blocks = num_blocks
        self.enable_prefix_caching = enable_prefix_caching
        self._ref_counts = [0] * num_blocks
        self._fresh_free: deque[int] = deque(range(num_blocks))
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self._prefix_cache = PrefixCache(block_size)
        self.prefix_cache_queries = 0  # tokens looked up in the prefix cache
        self.prefix_cache_hits = 0  # of which found

    # ---- counters --------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._fresh_free) + len(self._cached_free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self._prefix_cache.num_cached_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def free_block_ids(self) -> list[int]:
        """Free blocks in allocation order (fresh first, then cached LRU-first)."""
        return list(self._fresh_free) + list(self._cached_free)

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ----------------------------------------------------------------------
    def find_cached_prefix(self, request: Request) -> list[int]:
        """Cached blocks matching the request's leading full token blocks. Never the block
        holding the last token: that token is recomputed to produce the next logits. Pure."""
        if not self.enable_prefix_caching:
            return []
        num_blocks = (request.num_tokens - 1) // self.block_size
        return self._prefix_cache.lookup(self._prefix_cache.request_hashes(request, num_blocks))

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
        hashes = self._prefix_cache.request_hashes(request, num_full)
        for index in range(start, num_full):
            self._prefix_cache.register(request.block_ids[index], hashes[index])
        request.num_hashed_blocks = num_full

    # ---- allocation ------------------------------------------------------------------------
    def allocate_slots(
        self,
        request: Request,
        num_computed_tokens: int,
        num_new_tokens: int,
        shared_block_ids: Sequence[int] = (),
    ) -> list[BlockCopy] | None:
        """Give the request slots for positions [0, num_computed_tokens + num_new_tokens).

        `shared_block_ids` (prefix-cache hits or a parent's blocks; only for a request holding
        none yet) are adopted first. Every shared block (ref count > 1) in the write range
        [num_computed_tokens, end) is copied to a private block; the copies are returned.
        All or nothing: None, with no state changed, when the free blocks do not suffice.
        """
        if shared_block_ids and request.block_ids:
            raise ValueError(f"request {request.request_id} already holds blocks")
        block_ids = list(shared_block_ids) if shared_block_ids else request.block_ids
        num_blocks = self.num_blocks_for(num_computed_tokens + num_new_tokens)
        num_new_blocks = max(0, num_blocks - len(block_ids))
        first_written = num_computed_tokens // self.block_size if num_new_tokens > 0 else num_blocks
        written = range(first_written, min(len(block_ids), num_blocks))
        to_copy = self._shared_indices(block_ids, shared_block_ids, written)
        num_free = self.num_free_blocks - self._num_revived(shared_block_ids)
        if num_new_blocks + len(to_copy) > num_free:
            return None
        for block_id in shared_block_ids:
            self._acquire(block_id)
        if shared_block_ids:
            request.block_ids = list(shared_block_ids)
        copies = [self._copy_on_write(request, i) for i in to_copy]
        request.block_ids.extend([self._allocate() for _ in range(num_new_blocks)])
        return copies

    def _shared_indices(
        self, block_ids: Sequence[int], shared_block_ids: Sequence[int], written: range
    ) -> list[int]:
        """The written blocks that will be shared (ref count > 1) once shared ones are adopted:
        those must be copied before they are written."""
        ref_counts = self._ref_counts
        if not shared_block_ids:  # every step of a running request: nothing is adopted
            return [i for i in written if ref_counts[block_ids[i]] > 1]
        adopted = set(shared_block_ids)
        return [i for i in written if ref_counts[block_ids[i]] + (block_ids[i] in adopted) > 1]

    def _num_revived(self, shared_block_ids: Sequence[int]) -> int:
        """Shared blocks that are free (cached, ref count 0): adopting them takes them out of
        the free lists too."""
        return (
            sum(1 for b in shared_block_ids if self._ref_counts[b] == 0) if shared_block_ids else 0
        )

    def trim(self, request: Request, num_tokens: int) -> None:
        """Free the request's blocks lying wholly beyond its first `num_tokens` positions
        (draft slots that verification rejected)."""
        keep = self.num_blocks_for(num_tokens)
        while len(request.block_ids) > keep:
            self._release(request.block_ids.pop())

    def free(self, request: Request) -> None:
        """Release all the request's blocks, first indexing its verified full blocks so that a
        later request (or this one, resumed) can reuse them. Safe to call twice."""
        self.cache_full_blocks(request)
        # Tail first: a request's last blocks are the least likely to be shared by a future
        # prompt, so they should be evicted before its leading ones.
        for block_id in reversed(request.block_ids):
            self._release(block_id)
        request.block_ids = []
        request.num_hashed_blocks = 0

    # ---- internals -------------------------------------------------------------------------
    def _allocate(self) -> int:
        if self._fresh_free:
            block_id = self._fresh_free.popleft()
        else:
            block_id, _ = self._cached_free.popitem(last=False)  # least recently freed
            self._prefix_cache.evict(block_id)
        self._ref_counts[block_id] = 1
        return block_id

    def _acquire(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._cached_free[block_id]  # only cached blocks are ever shared while free
        self._ref_counts[block_id] += 1

    def _release(self, block_id: int) -> None:
        if self._ref_counts[block_id] <= 0:
            raise RuntimeError(f"block {block_id} freed more often than allocated")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] > 0:
            return
        if self._prefix_cache.is_cached(block_id):
            self._cached_free[block_id] = None  # most recently freed goes last
        else:
            self._fresh_free.append(block_id)

    def _copy_on_write(self, request: Request, index: int) -> BlockCopy:
        src = request.block_ids[index]
        dst = self._allocate()
        self._ref_counts[src] -= 1  # stays >= 1: another owner still holds it
        request.block_ids[index] = dst
        return (src, dst)
