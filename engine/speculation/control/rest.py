"""PlanningRest: when the driver may skip a resting policy's plan (SpecPolicy.rests: goodput).

Planning is not free: the proposers' offers, the candidates and the policy's search cost
0.2-4 ms a step at 1-64 requests on the 2-core VM (docs/benchmarks.md §5y, §5z), a larger share
of a GPU's 2-5 ms decode step. A plan pays for itself only through the drafts it gets
accepted. So the driver rests, asking for a plan on one step in REST_EVERY only, while either
- the last REST_AFTER plans drafted nothing (chat under load: every offer priced out), or
- over the last REST_AFTER planning steps, the drafts accepted added a smaller share of
  tokens than planning took of the steps' time: sum(accepted) / sum(emitted - accepted) <
  sum(plan seconds) / sum(step seconds). Resting saves about that time share; the accepted
  share is at least what speculation added to goodput (the verify rows' extra time is left
  out), so the rule rests only where planning does not pay at the current rate even with
  the drafts counted as free.

The steps between draft nothing and plan nothing. Open shadow checks are still fed and the
cost model still observes every step (new checks start on the planning steps only). The
planning steps keep the ledger, so the rest ends as soon as drafts come to pay again (a
request that comes to pay waits at most REST_EVERY - 1 steps for its drafts). Pure Python;
the driver (SpecDriver.plan, observe) feeds it.
"""

from __future__ import annotations

from collections import deque

REST_AFTER = 16  # plans (or planning steps) a rest looks back over
REST_EVERY = 4  # resting, one step in this many plans


class PlanningRest:
    """The driver's rest: the idle plans in a row, the turn while resting, and the ledger."""

    def __init__(self) -> None:
        self._idle_plans = 0  # plans in a row that drafted nothing
        self._turn = 0  # steps since the last plan while resting
        # per planning step observed: (drafts accepted, tokens emitted, plan s, step s)
        self._ledger: deque[tuple[int, int, float, float]] = deque(maxlen=REST_AFTER)

    def skips(self) -> bool:
        """Whether this step rests (no offers, no plan); counts the turn while resting."""
        if self._idle_plans < REST_AFTER and self.pays():
            return False
        self._turn = (self._turn + 1) % REST_EVERY
        return self._turn != 0

    def planned(self, drafted: bool) -> None:
        """A plan ran; whether it drafted anything."""
        self._idle_plans = 0 if drafted else self._idle_plans + 1

    def observed(
        self, accepted: int, emitted: int, plan_seconds: float, step_seconds: float
    ) -> None:
        """A planning step's outcome: its accepted drafts, emitted tokens, the plan's seconds
        and the whole step's (plan included)."""
        self._ledger.append((accepted, emitted, plan_seconds, step_seconds))

    def pays(self) -> bool:
        """Whether planning paid over the last REST_AFTER planning steps (True until that
        many were observed)."""
        if len(self._ledger) < REST_AFTER:
            return True
        accepted = sum(entry[0] for entry in self._ledger)
        plain = sum(entry[1] for entry in self._ledger) - accepted
        planning = sum(entry[2] for entry in self._ledger)
        seconds = sum(entry[3] for entry in self._ledger)
        return accepted * seconds >= planning * max(1, plain)
