"""Acceptance: per-request estimates of how often drafts are accepted, and what they are worth.

Chains, Bernoulli(a) per position: draft j is accepted with probability a^j, so a chain of k
drafts emits E(k) = (1 - a^(k+1)) / (1 - a) tokens in expectation.

Trees (node budgets). Approximation: the proposer ranks candidate tokens at each position, and
the rank-r candidate is the correct one with probability a(1 - a)^(r - 1) (rank 1: a, the
chain's per-position acceptance), independently along a path. A node is accepted iff every
node on its path is correct, and at most one node per depth can be, so the expected accepted
length is the sum of the nodes' path probabilities; a best-first tree of n nodes takes the n
largest ones, so g(j) is the j-th largest path probability (the per-depth acceptance of such a
tree follows). a is fitted per request by matching the mean accepted length at the mean budget.
"""

from __future__ import annotations

import functools
import heapq

from engine.request import SpecState
from engine.speculation.control.policy import SpecResult

MAX_TREE_NODES = 256  # SpecConfig.spec_tree_nodes upper bound
GRID = 100  # tree acceptance is resolved on a grid of 1/GRID
# Calibration (AcceptanceEstimator.calibration): decay per verified request of the sums of
# accepted and expected drafts, which start at CALIBRATION_PRIOR each (a ratio of 1); the
# ratio is kept in [CALIBRATION_FLOOR, 1].
CALIBRATION_DECAY = 0.98
CALIBRATION_PRIOR = 8.0
CALIBRATION_FLOOR = 0.25


def expected_emitted(acceptance: float, k: int) -> float:
    """Expected tokens a chain of k drafts emits (accepted drafts + the bonus/correction)."""
    if acceptance >= 1.0:
        return k + 1.0
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


@functools.lru_cache(maxsize=GRID + 1)
def tree_gains(grid_index: int) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Path probabilities of a best-first tree's nodes, largest first, and each node's depth,
    for rank-1 acceptance a = grid_index / GRID (see the module docstring)."""
    a = grid_index / GRID

    def rank_probability(rank: int) -> float:
        return a * (1.0 - a) ** (rank - 1)

    # Enumerate nodes in decreasing path probability: popping a node offers its first child
    # and its next-ranked sibling, the only candidates that can come next (k-best search).
    heap = [(-rank_probability(1), 1, 1, 1.0)]  # (-path prob, depth, rank, parent path prob)
    gains: list[float] = []
    depths: list[int] = []
    while heap and len(gains) < MAX_TREE_NODES and -heap[0][0] > 0.0:
        negative, depth, rank, parent = heapq.heappop(heap)
        gains.append(-negative)
        depths.append(depth)
        heapq.heappush(heap, (negative * rank_probability(1), depth + 1, 1, -negative))
        heapq.heappush(heap, (-parent * rank_probability(rank + 1), depth, rank + 1, parent))
    padding = MAX_TREE_NODES - len(gains)
    return tuple(gains) + (0.0,) * padding, tuple(depths) + (depths[-1] if depths else 1,) * padding


@functools.lru_cache(maxsize=GRID + 1)
def _tree_cumulative(grid_index: int) -> tuple[float, ...]:
    """cumulative[n] = expected accepted nodes of a best-first tree of n nodes."""
    total, cumulative = 0.0, [0.0]
    for gain in tree_gains(grid_index)[0]:
        total += gain
        cumulative.append(total)
    return tuple(cumulative)


def tree_acceptance(mean_accepted: float, mean_budget: float) -> float:
    """The rank-1 acceptance whose best-first tree of `mean_budget` nodes accepts
    `mean_accepted` nodes on average (bisection on the grid; the tables are monotone in a)."""
    budget = min(MAX_TREE_NODES, max(1, round(mean_budget)))
    low, high = 0, GRID
    while low < high:
        middle = (low + high) // 2
        if _tree_cumulative(middle)[budget] < mean_accepted:
            low = middle + 1
        else:
            high = middle
    return low / GRID


class AcceptanceEstimator:
    """Per-request acceptance a_i as exponentially weighted counts, seeded by a global prior.
    A request's counts live on the request (SpecState.acceptance, under this estimator's
    name: one estimator per proposer); the global prior lives here.

    Chains: a drafted chain is a run of Bernoulli(a) trials stopped at the first rejection or
    after k drafts, so m accepted of k drafted is m successes in m + 1 trials (m < k) or k in k;
    a = EMA(successes) / EMA(trials) (accepted/drafted would be biased low by the truncation).
    Trees: EMAs of accepted length and node budget, inverted through the rank model.
    The global prior is the same estimate over all requests, clamped so it cannot collapse.

    Kinds: where a proposal's kind is known before the plan (n-gram: the matched order), each
    request keeps counts per kind (under "<name>#<kind>") and each kind has its own global
    prior, first seeded from the overall one; the overall prior pools every kind.

    Calibration: drafts run where a request's estimate is high, and a few verifications make
    a noisy estimate, so the estimates of the drafts that run read above their truth (on
    SmolLM2 chat under load, 10% above: docs/benchmarks.md §5l). `calibration` is what the
    drafts run accepted over what their estimates expected, and the policy values a draft
    by it.
    """

    def __init__(
        self,
        prior: float = 0.5,
        tree: bool = False,
        decay: float = 0.9,
        global_decay: float = 0.99,
        prior_weight: float = 2.0,
        prior_bounds: tuple[float, float] = (0.1, 0.95),
        name: str = "",
    ) -> None:
        if not 0.0 <= prior <= 1.0:
            raise ValueError(f"acceptance prior must be in [0, 1], got {prior}")
        self.name = name  # the proposer whose drafts it estimates ("": the only one)
        self.tree = tree
        self.decay = decay
        self.global_decay = global_decay
        self.prior_weight = prior_weight
        self.prior_bounds = prior_bounds
        self._global = self._seed(prior)  # over every kind
        self._kinds: dict[str, list[float]] = {}  # per kind: its own global counts
        self._keys: dict[str, str] = {}  # per kind: its counts' key on a request (_key)
        self.num_updates = 0  # verifications of its drafts seen, on any request
        self._calibration = [CALIBRATION_PRIOR, CALIBRATION_PRIOR]  # accepted, expected

    def _seed(self, a: float) -> list[float]:
        # Pseudo-counts worth prior_weight observations: chains [successes, trials],
        # trees [accepted, budget, observations] as if budget-1 trees accepted a of them.
        w = self.prior_weight
        return [a * w, w, w] if self.tree else [a * w, w]

    def _rate(self, counts: list[float]) -> float:
        if self.tree:
            return tree_acceptance(counts[0] / counts[2], counts[1] / counts[2])
        return counts[0] / counts[1] if counts[1] > 0.0 else 0.0

    def prior(self, kind: str = "") -> float:
        low, high = self.prior_bounds
        return min(high, max(low, self._rate(self._kinds.get(kind, self._global))))

    def _key(self, kind: str) -> str:
        key = self._keys.get(kind)
        if key is None:  # once per kind: rate() runs per request and proposer every plan
            key = self._keys[kind] = f"{self.name}#{kind}" if kind else self.name
        return key

    def rate(self, spec: SpecState, kind: str = "") -> float:
        """The request's estimate for proposals of this kind (the kind's prior until its drafts
        of that kind were verified)."""
        counts = spec.acceptance.get(self._key(kind))
        return self.prior(kind) if counts is None else self._rate(counts)

    @property
    def calibration(self) -> float:
        """Accepted drafts over the drafts their estimates expected, of the drafts the policy
        ran (decayed sums), in [CALIBRATION_FLOOR, 1]: below 1 where the estimates acted on
        are optimistic. Never above 1, so it cannot talk the policy into drafts."""
        accepted, expected = self._calibration
        return min(1.0, max(CALIBRATION_FLOOR, accepted / expected))

    def calibrate(self, expected: float, accepted: int) -> None:
        """One verified request: `expected` drafts accepted by the plan's estimate (the sum of
        its drafts' gains), `accepted` by the target."""
        if expected <= 0.0:
            return
        sums = self._calibration
        sums[0] = CALIBRATION_DECAY * sums[0] + accepted
        sums[1] = CALIBRATION_DECAY * sums[1] + expected

    def update(self, result: SpecResult) -> None:
        drafted, accepted = result.num_draft_tokens, result.num_accepted_tokens
        if drafted <= 0:
            return
        self.num_updates += 1
        if self.tree:
            sample = [accepted, drafted, 1.0]
        else:
            sample = [accepted, accepted + 1 if accepted < drafted else drafted]
        kind = result.kind
        counts = result.spec.acceptance.setdefault(self._key(kind), self._seed(self.prior(kind)))
        pooled = [self._global]
        if kind:
            pooled.append(self._kinds.setdefault(kind, list(self._global)))
        for i, value in enumerate(sample):
            counts[i] = self.decay * counts[i] + value
            for totals in pooled:
                totals[i] = self.global_decay * totals[i] + value
