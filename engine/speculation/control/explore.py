"""Exploration: which (request, proposer) a goodput plan forces to draft once (a probe), so
that acceptance estimates that fell to ~0, or were never measured, can recover.

A (request, proposer) not run for `interval` plans (past four candidates, four plans per
candidate: each probe is a verify row every request in the step waits for) is probed, the one
idle longest, one per plan, if the probe's extra seconds (a draft model's catch-up of everything
it missed) are within its allowance: EXPLORE_SHARE of the idle plans' steps, and if it could
pay off (the policy's `worth`: probe_value.py). A proposer not yet
settled (verified once anywhere; a draft model FIRST_PROBES times) is budgeted on every plan so
far less what its earlier probes spent, and a draft model not yet settled does not wait out the
interval. The clock counts plans and the steps the driver rested (control/rest.py), so idle
requests age by steps, as a draft model's catch-up grows. A proposer whose chains are shadow-
checked (engine/speculation/shadow.py: the model-free ones under goodput) is never probed: its
checks feed its estimate at no verify row, where a probe costs one that every request in the
step waits for (at four SmolLM2 chat requests 7 of 18 drafting plans were probes, which
accepted 1 draft in 7: docs/benchmarks.md §5zd). Pure Python; GoodputPolicy owns one.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

from engine.speculation.control.acceptance import AcceptanceEstimator
from engine.speculation.control.policy import SpecCandidate

# A forced probe may cost at most this share of the time since the probed (request, proposer)
# last ran: a draft model's probe first feeds everything it missed (hundreds of tokens after a
# long idle spell), and probing it every explore_interval plans regardless cost auto a third
# of its speed on the Qwen pair (docs/benchmarks.md §4g).
EXPLORE_SHARE = 0.05
# A draft model is probed without waiting out explore_interval until its drafts were verified
# this many times anywhere. One verification moves the 0.5 prior only to ~0.68, where on the
# Qwen pair drafting does not yet pay, and a draft model that then idles falls behind by a token
# a step: where catching up a token costs more than EXPLORE_SHARE of a step (the 0.5B's prefill
# beside the 1.5B's decode on 2 Zen 5 cores: ~1.1 of ~18-24 ms), a probe that waited out the
# interval was never affordable, and goodput never drafted with it (docs/benchmarks.md §5za).
FIRST_PROBES = 4
# Idle (request, proposer) pairs a plan asks whether a probe could pay off, longest idle first:
# each question prices a few steps with the cost model.
WORTH_CHECKS = 4


class Exploration:
    """The exploration clock, the probe of a plan, and what unsettled proposers' probes spent."""

    def __init__(
        self,
        estimators: Mapping[str, AcceptanceEstimator],
        lagging: frozenset[str],
        interval: int = 16,
    ) -> None:
        """estimators: one per proposer name, in the order caps and costs index them;
        lagging: the names that are separate draft models (they fall behind while idle)."""
        self.estimators = estimators
        self.proposers = tuple(estimators)
        self.lagging = lagging
        self.interval = interval
        self.shadowed: frozenset[str] = frozenset()  # names whose chains shadow checks test
        self.clock = 0  # plans, and the steps the driver rested
        self._spent: dict[str, float] = {}  # seconds of probes before settling

    def tick(self) -> None:
        """A plan, or a step the driver rested (GoodputPolicy.rest_step)."""
        self.clock += 1

    def probe(
        self,
        candidates: Sequence[SpecCandidate],
        caps: list[list[int]],
        cost: Callable[[int, int], float] | None = None,
        step_seconds: float = 0.0,
        worth: Callable[[int, int], bool] | None = None,
    ) -> tuple[int, int] | None:
        """The (request i, proposer j) to give one draft this plan, or None. caps[i][j]:
        proposer j's cap on request i; cost(i, j): the seconds of drafting with it beyond the
        step (a draft model's catch-up), within its allowance at step_seconds a step;
        worth(i, j): whether the probe could pay off (probe_value.py), asked of the
        WORTH_CHECKS idle longest, in that order."""
        interval = self.interval
        if len(candidates) > 4:
            interval = max(interval, 4 * len(candidates))
        idle = []
        for i, candidate in enumerate(candidates):
            for j, name in enumerate(self.proposers):
                if name in self.shadowed:
                    continue
                # the plan that last ran it on this request (or first saw the request)
                last = candidate.spec.last_run.setdefault(name, self.clock)
                idle_plans = self.clock - last
                waits = self.settled(name) or name not in self.lagging
                if caps[i][j] <= 0 or (waits and idle_plans < interval):
                    continue
                seconds = cost(i, j) if cost is not None else 0.0  # only where it could run
                if seconds == 0.0 or seconds <= self._allowance(name, idle_plans, step_seconds):
                    idle.append((last, i, j))
        for _, i, j in heapq.nsmallest(WORTH_CHECKS if worth is not None else 1, idle):
            if worth is None or worth(i, j):
                return i, j
        return None

    def spend(self, proposer: str, seconds: float) -> None:
        """A probe of the proposer was forced at these extra seconds."""
        if not self.settled(proposer):
            self._spent[proposer] = self._spent.get(proposer, 0.0) + seconds

    def settled(self, proposer: str) -> bool:
        """Whether its drafts were verified often enough anywhere for its estimate to stand
        (model-free proposers: once; draft models: FIRST_PROBES times)."""
        needed = FIRST_PROBES if proposer in self.lagging else 1
        return self.estimators[proposer].num_updates >= needed

    def _allowance(self, proposer: str, idle_plans: int, step_seconds: float) -> float:
        """The seconds a probe of the proposer may spend beyond its step: EXPLORE_SHARE of
        the request's idle plans' steps; while the proposer is not settled, of every plan so
        far less what its earlier probes spent (its estimate is a guess every later choice of
        it rests on, so it is budgeted on all plans, not one request's)."""
        if self.settled(proposer):
            return EXPLORE_SHARE * idle_plans * step_seconds
        return EXPLORE_SHARE * self.clock * step_seconds - self._spent.get(proposer, 0.0)
