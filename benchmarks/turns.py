"""The order in which configs (engines, policies) take turns in an interleaved benchmark.

Run in a fixed order, a config always runs right after the same other one and finds that
one's after-effects (weights just read into or evicted from the cache, the collector's debt,
the memory's clock): in draft_pair.py that order alone cost `auto` 4% (docs/benchmarks.md
§5zp). A Williams design balances both place and predecessor.
"""

from __future__ import annotations


def turn_order(names: list[str], turn: int) -> list[str]:
    """The configs' order for one turn, from a Williams design: over a cycle of len(names) turns
    (2 x len(names) when odd) every config runs once in every place and runs right after every
    other config equally often, so none always finds the same one's weights just read."""
    n = len(names)
    first = [0] + [(i + 1) // 2 if i % 2 else n - i // 2 for i in range(1, n)]
    row = [(j + turn) % n for j in first]
    if n % 2 and (turn // n) % 2:
        row.reverse()
    return [names[j] for j in row]
