"""benchmarks/turns.py: the interleaved benchmarks' balanced order of turns."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.turns import turn_order


@pytest.mark.parametrize("count", [2, 3, 4, 5])
def test_interleaved_turns_balance_place_and_predecessor(count):
    """Over a cycle of turns every config runs equally often in every place, and every ordered
    pair of configs is adjacent within a turn equally often (a plain rotation fails this: it
    keeps the same neighbours turn after turn)."""
    names = [f"c{i}" for i in range(count)]
    cycle = count if count % 2 == 0 else 2 * count
    turns = [turn_order(names, turn) for turn in range(cycle)]
    for place in range(count):
        assert Counter(turn[place] for turn in turns) == {name: cycle // count for name in names}
    pairs = Counter((a, b) for turn in turns for a, b in zip(turn, turn[1:]))
    assert len(pairs) == count * (count - 1)
    assert len(set(pairs.values())) == 1
