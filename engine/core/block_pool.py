"""BlockPool: one pool of KV blocks: ref counts, the two free lists, the prefix index. Pure Python.

The block manager keeps one pool for the layers that attend the whole history and, for a model
with sliding-window layers, a second one for those layers (engine/core/block_manager.py). A
block id names pages in its own pool's layers only.

Free blocks sit in two lists. `_fresh_free` holds blocks with no reusable content; `_cached_free`
holds freed blocks still indexed by the prefix cache, least recently freed first. Allocation takes
a fresh block and evicts a cached one (LRU) only when no fresh block is left, so cached prefixes
live as long as possible. Both lists count as free: num_free_blocks = len(fresh) + len(cached).

Invariants: ref_count(b) == number of live table entries holding b; a block is in exactly one
free list iff its ref count is 0.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from engine.core.prefix_cache import PrefixCache
from engine.outputs import BlockCopy

NULL_BLOCK = -1  # a window table's entry for a block that slid out of every query's window

__all__ = ["NULL_BLOCK", "BlockCopy", "BlockPool"]


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_total_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._fresh_free: deque[int] = deque(range(num_blocks))
        self._cached_free: OrderedDict[int, None] = OrderedDict()
        self.prefix = PrefixCache(block_size)

    @property
    def num_free_blocks(self) -> int:
        return len(self._fresh_free) + len(self._cached_free)

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free_blocks / self.num_total_blocks

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def free_block_ids(self) -> list[int]:
        """Free blocks in allocation order (fresh first, then cached LRU-first)."""
        return list(self._fresh_free) + list(self._cached_free)

    def shared_indices(
        self, table: Sequence[int], adopted: Iterable[int], written: range
    ) -> list[int]:
        """The written entries of `table` that will be shared (ref count > 1) once `adopted`
        blocks are taken: those must be copied before they are written."""
        ref_counts = self._ref_counts
        adopted = set(adopted)
        if not adopted:  # every step of a running request: nothing is adopted
            return [i for i in written if ref_counts[table[i]] > 1]
        return [i for i in written if ref_counts[table[i]] + (table[i] in adopted) > 1]

    def num_revived(self, adopted: Iterable[int]) -> int:
        """Adopted blocks that are free (cached, ref count 0): adopting them takes them out of
        the free lists too."""
        return sum(1 for b in adopted if self._ref_counts[b] == 0)

    def allocate(self) -> int:
        if self._fresh_free:
            block_id = self._fresh_free.popleft()
        else:
            block_id, _ = self._cached_free.popitem(last=False)  # least recently freed
            self.prefix.evict(block_id)
        self._ref_counts[block_id] = 1
        return block_id

    def acquire(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._cached_free[block_id]  # only cached blocks are ever shared while free
        self._ref_counts[block_id] += 1

    def release(self, block_id: int) -> None:
        if self._ref_counts[block_id] <= 0:
            raise RuntimeError(f"block {block_id} freed more often than allocated")
        self._ref_counts[block_id] -= 1
        if self._ref_counts[block_id] > 0:
            return
        if self.prefix.is_cached(block_id):
            self._cached_free[block_id] = None  # most recently freed goes last
        else:
            self._fresh_free.append(block_id)

    def copy_on_write(self, table: list[int], index: int) -> tuple[int, int]:
        """Give `table` a private copy of its shared block at `index`: (src, dst)."""
        src = table[index]
        dst = self.allocate()
        self._ref_counts[src] -= 1  # stays >= 1: another owner still holds it
        table[index] = dst
        return (src, dst)
