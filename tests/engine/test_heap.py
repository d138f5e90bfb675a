"""engine/front/heap.py: the start-up heap frozen, and the collector's pauses measured."""

from __future__ import annotations

import gc

import pytest

from engine.front.heap import CollectorPauses, collection_paused_then_frozen


def test_collection_pauses_during_the_load_and_what_it_built_is_frozen():
    assert gc.isenabled()
    try:
        with collection_paused_then_frozen():
            assert not gc.isenabled()
            built = [[] for _ in range(10)]  # lists are tracked by the collector
        assert gc.isenabled() and gc.get_freeze_count() >= len(built)
        with pytest.raises(RuntimeError), collection_paused_then_frozen():
            raise RuntimeError("load failed")
        assert gc.isenabled()
    finally:
        gc.unfreeze()


def test_collector_pauses_count_each_pass_and_the_full_ones_apart():
    with CollectorPauses() as pauses:
        gc.collect(0)
        gc.collect(2)
        gc.collect(2)
    gc.collect(2)  # after the block: not counted
    assert (pauses.count, pauses.full_count) == (3, 2)
    assert 0.0 < pauses.full_seconds <= pauses.seconds
    assert pauses.as_dict()["gc_full_passes"] == 2
    assert pauses._on_pass not in gc.callbacks
