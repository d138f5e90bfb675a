"""Counter-based random numbers: the uniform for a request's token at position t is a pure
function of (seed, t) (DESIGN §5).

Why: a sampled request's text must not depend on how it was scheduled. The token at position t
is drawn by inverse CDF from the target's distribution with u = uniform(seed, t), whether that
step decodes one token, verifies a chain of k drafts, verifies a tree, runs alone or batched.
A draft model drafts position t with the same u (common random numbers), so its draft agrees
with the target's token as often as their distributions allow. A per-request stateful
generator cannot give this: a verify step would consume a different amount of it than a plain
step, and the amount depends on k, which depends on load.

The hash is SplitMix64 (Steele, Lea & Flood 2014) applied to the seed, then to the seed's hash
mixed with the position; the top 53 bits give a float64 in [0, 1).
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


def uniforms(seeds: Sequence[int], positions: Sequence[int]) -> np.ndarray:
    """float64 [n] in [0, 1): uniforms[i] = u(seeds[i], positions[i]). Seeds are taken mod 2**63."""
    with np.errstate(over="ignore"):
        seed = np.array([s & _MASK63 for s in seeds], dtype=np.uint64)
        position = np.array(positions, dtype=np.uint64)
        bits = _splitmix64(_splitmix64(seed) ^ (position * _GOLDEN))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
