"""One plan's options, per candidate and proposer: the acceptance estimate its drafts' gains
follow (chains: draft t gains value * a^t; trees: the node gains given), the cap, a forced
floor (an exploration probe), the CPU seconds of drafting and whether the proposer runs
draft-model passes. GoodputPolicy builds them once per plan (goodput.py); a search takes them
as SearchSlots, and the best responses between searches read them in place: one slot at a
time in Python for a few options (a plan at batch 1 must cost microseconds: on a GPU a whole
step is ~2 ms), as one OptionTable for many (a plan at batch 64 must not cost a Python object
per option).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.speculation.control.search import Prices, best_responses
from engine.speculation.control.search_problem import OptionTable, SearchSlot

# Up to this many options (candidates x proposers) the best responses run in Python.
SCALAR_OPTIONS = 12


@dataclass
class PlanOptions:
    """Per option (candidate i, proposer j) at index i * len(proposers) + j of the flat lists."""

    proposers: tuple[str, ...]  # the option names, in order
    draft: tuple[bool, ...]  # per proposer: runs draft-model passes (k drafts, k passes)
    values: tuple[float, ...]  # per proposer: its drafts' value per expected acceptance
    rates: list[float]  # the acceptance estimate
    caps: list[int]
    floors: list[int]  # > cap where a probe ruled the option out
    seconds: list[float]  # CPU seconds when it drafts
    nodes: list[Sequence[float]] | None = None  # trees: node gains; None: chains

    @property
    def num_candidates(self) -> int:
        return len(self.caps) // len(self.proposers)

    def gains(self, i: int, j: int) -> list[float]:
        """The valued gains of drafts 1..cap of candidate i's option j."""
        at, value = i * len(self.proposers) + j, self.values[j]
        if self.nodes is None:
            a = self.rates[at]
            return [value * a**t for t in range(1, self.caps[at] + 1)]
        return [value * gain for gain in self.nodes[at][: self.caps[at]]]

    def force(self, i: int, j: int) -> None:
        """Candidate i drafts with option j only, one draft at least (a probe)."""
        m = len(self.proposers)
        for at in range(i * m, i * m + m):
            self.floors[at] = 1
            if at != i * m + j:
                self.caps[at] = 0

    def table(self) -> OptionTable:
        """The options as arrays [candidate, proposer, k] (chains computed at once)."""
        shape = (self.num_candidates, len(self.proposers))
        caps = np.array(self.caps, dtype=np.int64).reshape(shape)
        width = int(caps.max(initial=0)) + 1
        k = np.arange(width)
        within = k <= caps[..., None]
        if self.nodes is None:
            rates = np.array(self.rates).reshape(shape)
            gains = np.array(self.values)[:, None] * rates[..., None] ** k[1:]
        else:
            rows = [self.gains(i, j) for i in range(shape[0]) for j in range(shape[1])]
            gains = np.array([_padded(row, width - 1) for row in rows]).reshape(*shape, -1)
        cumulative = np.concatenate((np.zeros((*shape, 1)), gains), axis=2)
        cumulative = np.where(within, np.cumsum(cumulative, axis=2), -np.inf)
        depths = np.where(within, k, 0)
        draft = np.empty(shape, dtype=bool)
        draft[:] = self.draft
        floors = np.array(self.floors, dtype=np.int64).reshape(shape)
        seconds = np.array(self.seconds, dtype=float).reshape(shape)
        return OptionTable(cumulative, depths, floors, caps, seconds, draft)

    def responses(self, prices: Prices, margin: float = 0.0) -> tuple[list[int], list[int]]:
        """Every candidate's best response at `prices` (search.best_responses): (ks, picks)."""
        if len(self.caps) > SCALAR_OPTIONS:
            return best_responses(self.table(), prices, margin)
        ks, picks = [], []
        for i in range(self.num_candidates):
            k, j = self._response(i, prices, prices.level * (1.0 + margin))
            ks.append(k)
            picks.append(j)
        return ks, picks

    def _response(self, i: int, prices: Prices, level: float) -> tuple[int, int]:
        """search.best_responses for candidate i in Python: the first best option, then the
        first best k; no valid choice: its first option's floor."""
        m = len(self.proposers)
        best, choice = -np.inf, (self.floors[i * m], 0)
        for j, draft in enumerate(self.draft):
            at = i * m + j
            floor, cap = self.floors[at], self.caps[at]
            limit = cap if prices.longest is None else min(cap, prices.longest)
            limit = max(floor, min(limit, prices.passes) if draft else limit)
            fixed = (prices.per_draft_request if draft else prices.per_request) + self.seconds[at]
            gains, emitted = self.gains(i, j), 0.0
            for k in range(min(limit, cap) + 1):
                emitted += gains[k - 1] if k else 0.0
                value = emitted - level * (prices.per_token * k + (fixed if k else 0.0))
                if k >= floor and value > best:
                    best, choice = value, (k, j)
        return choice

    def slots(self) -> list[list[SearchSlot]]:
        """Each candidate's options the search chooses among (not those a probe ruled out)."""
        m = len(self.proposers)
        return [
            [
                SearchSlot(
                    self.gains(i, j),
                    range(1, self.caps[at] + 1),
                    self.caps[at],
                    self.floors[at],
                    self.proposers[j],
                    self.draft[j],
                    self.seconds[at],
                )
                for j, at in enumerate(range(i * m, i * m + m))
                if self.floors[at] <= self.caps[at]
            ]
            for i in range(self.num_candidates)
        ]

    def passes(self, ks: Sequence[int], picks: Sequence[int]) -> int:
        """The draft-model passes of a plan: its deepest draft-model chain."""
        return max((k for k, j in zip(ks, picks) if self.draft[j]), default=0)

    def cpu_seconds(self, ks: Sequence[int], picks: Sequence[int]) -> float:
        m = len(self.proposers)
        return sum(self.seconds[i * m + j] for i, (k, j) in enumerate(zip(ks, picks)) if k > 0)

    def emitted(self, ks: Sequence[int], picks: Sequence[int]) -> float:
        """Expected tokens the plan emits."""
        return sum(1.0 + sum(self.gains(i, j)[:k]) for i, (k, j) in enumerate(zip(ks, picks)))

    def expected(self, i: int, j: int, k: int) -> tuple[float, ...]:
        """The estimate's gains of the first k drafts (the valued gains over the value)."""
        if self.nodes is None:
            a = self.rates[i * len(self.proposers) + j]
            return tuple(a**t for t in range(1, k + 1))
        return tuple(gain / self.values[j] for gain in self.gains(i, j)[:k])


def _padded(values: Sequence[float], width: int) -> list[float]:
    return [*values, *(0.0,) * (width - len(values))]
