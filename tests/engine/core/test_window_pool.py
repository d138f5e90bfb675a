"""The sliding-window layers' own block pool: what a request holds there, what it releases, how
prefix hits and forks share it, copy-on-write inside it, all-or-nothing allocation across both
pools; and how the KV budget splits between the pools (engine/core/kv_budget.py)."""

from __future__ import annotations

import pytest

from engine.core.block_manager import NULL_BLOCK, BlockCopy, BlockManager, WindowGroup
from engine.core.kv_budget import split_kv_cache, window_blocks_needed
from tests.engine.factories import make_requests

BLOCK = 4
WINDOW = 6  # a query at p reads p - 5 .. p


def _manager(num_blocks: int = 64, num_window_blocks: int = 16) -> BlockManager:
    return BlockManager(num_blocks, BLOCK, window=WindowGroup(WINDOW, num_window_blocks))


def _step(manager: BlockManager, request, num_new: int) -> list[BlockCopy]:
    """Allocate for `num_new` tokens at the request's position and mark them computed."""
    copies = manager.allocate_slots(request, request.num_computed_tokens, num_new)
    assert copies is not None
    request.num_computed_tokens += num_new
    manager.cache_full_blocks(request)
    return copies


def _held(table: list[int]) -> list[int]:
    return [b for b in table if b != NULL_BLOCK]


def _check_counts(manager: BlockManager, requests) -> None:
    """Each pool's ref counts equal the table entries holding each block."""
    window = manager.window_pool
    for block in range(window.num_total_blocks):
        held = sum(r.window_block_ids.count(block) for r in requests)
        assert window.ref_count(block) == held
    for block in range(manager.num_total_blocks):
        assert manager.ref_count(block) == sum(r.block_ids.count(block) for r in requests)


def test_a_long_decode_holds_only_its_window():
    manager = _manager()
    (request,) = make_requests(1, prompt_len=200)
    _step(manager, request, 8)  # a prefill chunk: positions 0..7
    for _ in range(100):
        _step(manager, request, 1)
        position = request.num_computed_tokens - 1
        first = manager.first_visible_block(position)
        table = request.window_block_ids
        # Everything a query at `position` reads is held, nothing before it.
        assert all(b == NULL_BLOCK for b in table[:first])
        assert NULL_BLOCK not in table[first:]
        assert len(_held(table)) <= -(-(WINDOW - 1) // BLOCK) + 2
        assert len(request.block_ids) == len(table)  # the full pool holds every position
    assert manager.window_pool.num_free_blocks >= 16 - 3
    _check_counts(manager, [request])
    manager.free(request)
    assert manager.window_pool.num_free_blocks == 16 and manager.num_free_blocks == 64


def test_a_chunk_holds_the_keys_its_first_query_reads():
    manager = _manager()
    (request,) = make_requests(1, prompt_len=40)
    _step(manager, request, 20)
    manager.allocate_slots(request, 20, 12)  # queries 20..31 read from position 15 on
    assert request.window_block_ids[: 15 // BLOCK] == [NULL_BLOCK] * (15 // BLOCK)
    assert NULL_BLOCK not in request.window_block_ids[15 // BLOCK :]
    assert len(request.window_block_ids) == 8


def test_allocation_is_all_or_nothing_across_the_pools():
    manager = _manager(num_blocks=64, num_window_blocks=3)
    first, second = make_requests(2, prompt_len=40)
    _step(manager, first, 8)  # two window blocks
    before = (manager.free_block_ids(), manager.window_pool.free_block_ids())
    assert manager.allocate_slots(second, 0, 8) is None  # the full pool has room, the window not
    assert (manager.free_block_ids(), manager.window_pool.free_block_ids()) == before
    assert second.block_ids == second.window_block_ids == []


def test_released_blocks_count_toward_the_same_allocation():
    manager = _manager(num_blocks=64, num_window_blocks=3)
    (request,) = make_requests(1, prompt_len=40)
    _step(manager, request, 12)  # blocks 0..2 (all 3 window blocks)
    assert manager.window_pool.num_free_blocks == 0
    # Queries 12..15 read from position 7 on: block 0 slides out and pays for block 3.
    assert manager.allocate_slots(request, 12, 4) == []
    assert request.window_block_ids[0] == NULL_BLOCK and len(request.window_block_ids) == 4


def test_prefix_hit_adopts_only_the_window_blocks_it_reads():
    manager = _manager()
    first, second = make_requests(2, prompt_len=0, prefix=list(range(17)))
    _step(manager, first, 16)  # 4 full blocks, all still in the window pool
    manager.free(first)
    shared = manager.find_cached_prefix(second)  # 17 tokens: 4 full blocks may be reused
    assert len(shared.block_ids) == 4
    # The next query sits at 16 and reads from 11 (block 2) on.
    assert shared.window_block_ids[:2] == [NULL_BLOCK, NULL_BLOCK]
    assert NULL_BLOCK not in shared.window_block_ids[2:]
    assert manager.allocate_slots(second, 16, 1, shared) == []
    assert second.window_block_ids[:2] == [NULL_BLOCK, NULL_BLOCK]
    assert second.window_block_ids[2:4] == shared.window_block_ids[2:]
    _check_counts(manager, [second])


def test_prefix_hit_shrinks_to_what_the_window_pool_still_has():
    manager = _manager()
    first, second = make_requests(2, prompt_len=0, prefix=list(range(40)))
    _step(manager, first, 8)
    for _ in range(24):  # decode on to 32: blocks 0..5 slide out (released, still indexed)
        _step(manager, first, 1)
    manager.free(first)
    for _ in range(4):  # another request takes 4 fresh window blocks, then 4 cached ones
        (other,) = make_requests(1, prompt_len=20)
        _step(manager, other, 4)
    evicted = [b for b in range(16) if not manager.window_pool.prefix.is_cached(b)]
    assert evicted  # some of first's window blocks lost their content
    shared = manager.find_cached_prefix(second)
    num_hit = len(shared.block_ids)
    assert 0 < num_hit <= 8
    first_read = manager.first_visible_block(num_hit * BLOCK)
    window = shared.window_block_ids
    assert len(window) == num_hit and NULL_BLOCK not in window[first_read:]
    assert all(manager.window_pool.prefix.is_cached(b) for b in window[first_read:])


def test_fork_shares_the_window_unless_the_parent_slid_past_it():
    manager = _manager()
    parent, child, late = make_requests(3, prompt_len=10)
    _step(manager, parent, 10)
    shared = manager.fork_blocks(parent, 10)
    assert shared.block_ids == parent.block_ids[:3]
    # The child recomputes position 9, which reads from 4 (block 1) on.
    assert shared.window_block_ids == [NULL_BLOCK] + parent.window_block_ids[1:3]
    copies = manager.allocate_slots(child, 9, 1, shared)
    assert copies == [
        BlockCopy(parent.block_ids[2], child.block_ids[2]),
        BlockCopy(parent.window_block_ids[2], child.window_block_ids[2], window=True),
    ]
    _check_counts(manager, [parent, child])
    for _ in range(12):  # the parent decodes on: block 1 slides out of its window
        _step(manager, parent, 1)
    assert manager.fork_blocks(parent, 10) is None
    manager.free(parent)
    manager.free(child)
    assert manager.window_pool.num_free_blocks == 16 and manager.num_free_blocks == 64
    assert late.window_block_ids == []


def test_trim_drops_rejected_draft_blocks_in_both_pools():
    manager = _manager()
    (request,) = make_requests(1, prompt_len=30)
    _step(manager, request, 9)
    manager.allocate_slots(request, 9, 1 + 6)  # one token and 6 draft slots: 0..15
    assert len(request.block_ids) == len(request.window_block_ids) == 4
    assert request.window_block_ids[0] == NULL_BLOCK  # position 9 reads from 4 on
    manager.trim(request, 11)  # two verified: positions 0..10
    assert len(request.block_ids) == len(request.window_block_ids) == 3
    _check_counts(manager, [request])


def test_the_window_pool_takes_what_every_seat_reads_and_the_rest_goes_to_full_layers():
    needed = window_blocks_needed(512, 16, 8, 512)
    assert needed == 8 * (32 + 3) + 32
    # Gemma 3's pattern: 5 sliding layers to each global one, 18 layers.
    windows = tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    split = split_kv_cache(2000, windows, 16, 8, 512, max_blocks_per_seq=2048)
    assert split.window == WindowGroup(512, needed)
    assert split.num_blocks == (2000 * 18 - 15 * needed) // 3
    assert split.num_blocks * 3 + needed * 15 <= 2000 * 18  # within the budget


def test_no_split_when_it_would_not_give_the_full_layers_more():
    windows = tuple(0 if (i + 1) % 6 == 0 else 512 for i in range(18))
    assert split_kv_cache(1820, windows, 16, 64, 512, 2048).window is None
    assert split_kv_cache(1820, (0, 0), 16, 1, 16, 2048).window is None  # no window layers


def test_every_layer_sliding_spends_the_budget_on_the_window_pool():
    split = split_kv_cache(300, (64,) * 4, 16, 8, 256, 128)
    assert split.window == WindowGroup(64, 300) and split.num_blocks == 8 * 128


@pytest.mark.parametrize("windows", [(64,) * 4, (64, 64, 64, 0)])
def test_a_draft_mirroring_the_full_pool_keeps_the_cache_unsplit(windows):
    split = split_kv_cache(300, windows, 16, 1, 16, 128, mirrored=True)
    assert split.window is None and split.num_blocks == 300
