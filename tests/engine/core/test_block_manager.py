"""BlockManager: allocation, ref counts, prefix caching (hash chain, LRU reuse), copy-on-write
and rollback, driven directly with hand-made requests (no scheduler, no model)."""

from __future__ import annotations

import pytest

from engine.core.block_manager import BlockCopy, BlockManager
from engine.core.block_pool import BlockPool
from engine.core.prefix_cache import hash_block_tokens
from tests.engine.factories import make_requests

BLOCK = 4


def _computed(manager: BlockManager, request, num_tokens: int) -> None:
    """Allocate slots for the request's first num_tokens tokens and mark them computed."""
    assert manager.allocate_slots(request, request.num_computed_tokens, num_tokens) == []
    request.num_computed_tokens += num_tokens
    manager.cache_full_blocks(request)


def test_allocate_and_free_restore_the_pool():
    manager = BlockManager(num_blocks=8, block_size=BLOCK)
    (request,) = make_requests(1, prompt_len=10)
    assert manager.allocate_slots(request, 0, 10) == []
    assert len(request.block_ids) == 3  # ceil(10 / 4)
    assert manager.num_free_blocks == 5
    assert manager.usage == pytest.approx(3 / 8)
    manager.free(request)
    assert request.block_ids == []
    assert manager.num_free_blocks == 8
    manager.free(request)  # a second free has nothing left to release
    assert manager.num_free_blocks == 8
    assert all(manager.ref_count(b) == 0 for b in range(8))


def test_allocation_is_all_or_nothing():
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    first, second = make_requests(2, prompt_len=12)
    assert manager.allocate_slots(first, 0, 12) == []
    before = (manager.free_block_ids(), list(second.block_ids))
    assert manager.allocate_slots(second, 0, 8) is None  # needs 2, one is free
    assert (manager.free_block_ids(), second.block_ids) == before
    assert manager.allocate_slots(second, 0, 4) == []


def test_releasing_a_free_block_raises():
    pool = BlockPool(num_blocks=2, block_size=BLOCK)
    with pytest.raises(RuntimeError, match="freed more often"):
        pool.release(0)


def test_prefix_hit_takes_full_blocks_but_never_the_last_token_block():
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    first, second, third = make_requests(3, prompt_len=0, prefix=list(range(12)))
    _computed(manager, first, 12)
    assert manager.num_cached_blocks == 3
    # Same 12 tokens: block 2 holds the last token, which must be recomputed for its logits.
    assert manager.find_cached_prefix(second).block_ids == first.block_ids[:2]
    third.prompt_token_ids.append(99)  # 13 tokens: all three full blocks may be reused
    assert manager.find_cached_prefix(third).block_ids == first.block_ids
    assert manager.allocate_slots(third, 12, 1, manager.find_cached_prefix(third)) == []
    assert third.block_ids[:3] == first.block_ids
    assert [manager.ref_count(b) for b in first.block_ids] == [2, 2, 2]


def test_hash_chain_names_the_whole_prefix():
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    first, second = make_requests(2, prompt_len=0, prefix=[1, 2, 3, 4, 5, 6, 7, 8, 9])
    _computed(manager, first, 9)
    second.prompt_token_ids[0] = 42  # block 1 is equal, but its prefix differs
    assert manager.find_cached_prefix(second).block_ids == []
    assert hash_block_tokens(b"", [1, 2]) != hash_block_tokens(b"x", [1, 2])


def test_draft_slots_are_never_hashed():
    manager = BlockManager(num_blocks=16, block_size=BLOCK)
    (request,) = make_requests(1, prompt_len=5)
    # 5 verified tokens computed, plus 7 reserved draft slots spanning two more blocks.
    assert manager.allocate_slots(request, 0, 12) == []
    request.num_computed_tokens = 5
    manager.cache_full_blocks(request)
    assert manager.num_cached_blocks == 1  # only block 0 is fully verified
    manager.trim(request, request.num_computed_tokens + 1)
    assert len(request.block_ids) == 2
    assert manager.num_free_blocks == 14


def test_freed_cached_blocks_are_reused_lru_first_and_only_when_needed():
    manager = BlockManager(num_blocks=6, block_size=BLOCK)
    old, new, filler = make_requests(3, prompt_len=9)
    _computed(manager, old, 9)  # blocks 0, 1 full (cached), block 2 partial
    manager.free(old)
    # Tail first: the partial block is fresh again; cached blocks in LRU order 1 then 0.
    assert manager.free_block_ids() == [3, 4, 5, 2, 1, 0]
    assert manager.allocate_slots(new, 0, 16) == []
    assert new.block_ids == [3, 4, 5, 2]  # fresh blocks first: the cache survives
    assert manager.find_cached_prefix(old).block_ids == [0, 1]
    assert manager.allocate_slots(filler, 0, 4) == []
    assert filler.block_ids == [1]  # then evict least recently freed (old's tail block)
    assert manager.find_cached_prefix(old).block_ids == [0]
    assert manager.num_cached_blocks == 1


def test_cached_prefix_revived_from_the_free_list():
    manager = BlockManager(num_blocks=4, block_size=BLOCK)
    first, second = make_requests(2, prompt_len=0, prefix=list(range(9)))
    _computed(manager, first, 9)
    manager.free(first)
    shared = manager.find_cached_prefix(second)
    assert shared.block_ids == [0, 1]
    # 4 free blocks, 2 revived from the cache: one more needed for token 8.
    assert manager.allocate_slots(second, 8, 1, shared) == []
    assert manager.num_free_blocks == 1
    manager.record_prefix_query(second.num_tokens, 8)
    assert (manager.prefix_cache_queries, manager.prefix_cache_hits) == (9, 8)


def test_capacity_counts_revived_blocks():
    manager = BlockManager(num_blocks=3, block_size=BLOCK)
    first, second = make_requests(2, prompt_len=0, prefix=list(range(9)))
    _computed(manager, first, 9)
    manager.free(first)
    shared = manager.find_cached_prefix(second)
    # 3 free blocks, but 2 are the revived prefix: 1 left, 2 needed for positions 8..12.
    assert manager.allocate_slots(second, 8, 5, shared) is None
    assert [manager.ref_count(b) for b in range(3)] == [0, 0, 0]
    assert manager.num_free_blocks == 3


def test_copy_on_write_of_a_shared_partial_block():
    manager = BlockManager(num_blocks=8, block_size=BLOCK)
    parent, child = make_requests(2, prompt_len=6)
    _computed(manager, parent, 6)
    shared = manager.fork_blocks(parent, 6)
    assert shared.block_ids == parent.block_ids[:2]
    copies = manager.allocate_slots(child, 5, 1, shared)  # rewrite position 5 (block 1)
    assert copies == [BlockCopy(parent.block_ids[1], child.block_ids[1])]
    assert child.block_ids[0] == parent.block_ids[0]
    assert child.block_ids[1] != parent.block_ids[1]
    assert manager.ref_count(parent.block_ids[0]) == 2
    assert manager.ref_count(parent.block_ids[1]) == 1
    manager.free(parent)
    manager.free(child)
    assert manager.num_free_blocks == 8


def test_prefix_caching_off_never_hits():
    manager = BlockManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=False)
    first, second = make_requests(2, prompt_len=0, prefix=list(range(9)))
    _computed(manager, first, 9)
    assert manager.find_cached_prefix(second).block_ids == []
    manager.record_prefix_query(9, 0)
    assert manager.num_cached_blocks == 0
    assert manager.prefix_cache_queries == 0
