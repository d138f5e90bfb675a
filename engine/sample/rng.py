"""Counter-based random numbers: the race key of a request's token at position t is a pure
function of (seed, t) (DESIGN §5), and the race's noise for token x a pure function of
(key, x) (kernels/sampling.py).

Why: a sampled request's text must not depend on how it was scheduled. The token at position t
is the winner of the exponential race over the target's distribution keyed by (seed, t),
whether that step decodes one token, verifies a chain of k drafts, verifies a tree, runs alone
or batched. A draft model drafts position t with the same key (the same noise), so its draft
is the target's token as often as the coupling allows (>= (1 - TV) / (1 + TV)). A per-request
stateful generator cannot give this: a verify step would consume a different amount of it
than a plain step, and the amount depends on k, which depends on load.

The key is SplitMix64 (Steele, Lea & Flood 2014) applied to the seed, then to the seed's hash
mixed with the position; it is returned as the int64 with the same bits.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MASK63 = (1 << 63) - 1


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def race_keys(seeds: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """int64 [n]: race_keys[i] = key(seeds[i], positions[i]). Seeds are taken mod 2**63."""
    with np.errstate(over="ignore"):
        seed = np.array([s & _MASK63 for s in seeds], dtype=np.uint64)
        position = np.array(positions, dtype=np.uint64)
        bits = _splitmix64(_splitmix64(seed) ^ (position * _GOLDEN))
    return bits.view(np.int64)
