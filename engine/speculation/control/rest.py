"""PlanningRest: when the driver may skip a resting policy's plan (SpecPolicy.rests: goodput).

Planning is not free: the proposers' offers, the candidates and the policy's search cost
0.2-4 ms a step at 1-64 requests on the 2-core VM (docs/benchmarks.md §5y, §5z), a larger share
of a GPU's 2-5 ms decode step. A plan pays for itself only through the drafts it gets
accepted. So the driver rests, asking for a plan REST_EVERY steps into the rest, then after twice
as many steps each time, up to REST_DEEPEST apart, while either
- the last REST_AFTER plans drafted nothing (chat under load: every offer priced out), or
- over the last REST_AFTER planning steps, speculation lowered goodput: the same steps
  without their drafts and plans would have emitted the tokens not accepted in the time less
  planning and the drafts' extra time, and sum(emitted) / sum(step seconds) < sum(emitted -
  accepted) / (sum(step seconds) - planning - extra), i.e. sum(accepted) * sum(step seconds)
  < sum(emitted) * (planning + extra). A drafting step's extra time is its measured seconds
  over the cost model's prediction of the step without its drafts, less the model's own bias
  (its median relative excess on the ledger's steps that drafted nothing); the verify rows are then
  paid for as measured, not as priced (at 16 chat requests on Zen 5 the model priced a draft
  row at ~0.4-0.6 ms where it cost ~1 ms, and goodput ran 0.81-0.95x off: docs/benchmarks.md
  §5zb).

Neither rests where planning is cheap (under REST_MIN_SHARE of the steps) while the longer
ledger of the last REST_HORIZON planning steps says speculation paid (paid_long): accepted
drafts come in runs far apart, and a rest begun between two delays the next.

The steps between draft nothing and plan nothing. The driver tends the first of them after a
plan and one in its REST_SEEN_EVERY after that: shadow checks start and are fed there, and the
cost model observes them. The planning steps keep the ledger, so the rest ends as soon as
drafts come to pay again (a request that comes to pay waits at most REST_DEEPEST - 1 steps for
its drafts, and up to REST_SEEN_EVERY steps where a shadow check would have paid: `wake`). One
plan in four had cost ~3% of four SmolLM2 chat requests' steps, where drafts never paid; one in
sixteen costs a quarter of that (docs/benchmarks.md §5ze). The steps between plans stop
doubling at REST_NEAR where the ledger returned at least REST_FAR of what its planning and
drafts cost, and at REST_DEEPEST where it returned less (`far`): under Poisson arrivals of
SmolLM2 chat near
saturation, where a resting ledger returned a median 0.38 of its cost, plans up to 64 apart
halved the plans (the latency's gap to off narrowed by 0.5-0.9 points, s.e. ~0.5, over three
to five runs), while 16 copying requests, whose resting ledger returned a median 0.94, ran
1.07x off with plans up to 16 apart and 1.02x with 64 (§5zj). The driver keeps one rest per
batch class (batch_class: 1, 2-3, 4-7, ... running requests), each with its own ledger; one
or two running requests (under REST_FROM) rest only while the long ledger, too, says
speculation did not pay (unpaid_long). Pure Python; the driver (SpecDriver.plan, observe)
feeds it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence

# A planning step in a ledger: (drafts accepted, tokens emitted, plan s, step s, drafts run,
# step s over the cost model's prediction of the step without its drafts)
Entry = tuple[int, int, float, float, int, float]

REST_AFTER = 16  # plans (or planning steps) a rest looks back over
REST_EVERY = 4  # resting, the steps to the first plan; each plan that rests on doubles them
REST_NEAR = 16  # up to this many while the ledger is near paying,
REST_DEEPEST = 64  # and up to this many while it is far from it:
REST_FAR = 0.75  # it returned under this share of its planning and drafts' cost
# Planning steps the long ledger holds: where planning is cheap (under REST_MIN_SHARE of the
# steps), no rest while speculation paid over them (PlanningRest.paid_long).
REST_HORIZON = 256
REST_MIN_SHARE = 0.015
# Fewer running requests than this do not rest on the short ledger alone: one or two requests'
# plans cost ~1% of their steps on the CPU VMs (4-6% on the H200's host, which chat's drafts
# paid for), and that rest was a trap. Resting, plans come 16-64 steps apart, so the ledger renews
# a planning step at a time and a prompt that starts to copy waits out the last one's rest. One
# process, off / goodput / goodput never resting taking turns (SmolLM2, 128 tokens; Xeon VM;
# docs/benchmarks.md §4k): alone, where the rest engaged, copy ran 1.04-1.42x off against
# 1.46-1.61x never resting, chat 0.99-1.07x against 0.99-1.14x; two at a time, four rounds,
# chat 0.995x against 1.058x, copy 1.129x against 1.158x; three or four at a time the rest won
# (chat 1.02x against 0.97x, copy 0.99x against 0.97x at three). On the H200 one request never
# resting ran chat 1.07x off against 0.99x, 471 of its 504 steps rested. They rest where the
# long ledger says speculation did not pay (PlanningRest.unpaid_long), once it holds
# REST_FEW_AFTER planning steps: SmolLM2 chat alone 1.026-1.035x off -> 1.007-1.008x, copy
# unchanged (never rested), the policy sweep's chat x1 cell 1.00-1.05 over five runs against
# 1.02-1.05 (§5zo).
REST_FROM = 3
REST_FEW_AFTER = 64
# Chains past this many drafts only while drafts pay, and up to twice the request's last chain
# if that was accepted whole (chain_cap).
SHORT_CHAIN = 4


def batch_class(num_requests: int) -> int:
    """The class of a batch of this many running requests, for which one rest's ledger holds:
    1, 2-3, 4-7, 8-15, ... (a token's worth in seconds, and a draft row's cost, change with
    the batch; between 16 SmolLM2 copying requests, where drafts did not pay, and one, where
    they paid 2.5x, a shared ledger rested the one: docs/benchmarks.md §5ze)."""
    return max(1, num_requests).bit_length()


class PlanningRest:
    """The driver's rest: the idle plans in a row, the turn while resting, and the ledger."""

    def __init__(self) -> None:
        self._idle_plans = 0  # plans in a row that drafted nothing
        self._every = REST_EVERY  # resting, the steps from one plan to the next
        self._wait = REST_EVERY  # resting, the steps left to the next plan
        # per planning step observed (Entry), the last REST_HORIZON; the ledger proper is
        # the last REST_AFTER of them (_recent)
        self._long: deque[Entry] = deque(maxlen=REST_HORIZON)
        self._return: float | None = None  # the ledger's return share (_returned), kept
        # until the ledger changes
        self._long_paid = False  # paid_long(), re-read every REST_AFTER entries
        self._long_unpaid = False  # unpaid_long(), re-read with it
        self._long_new = 0  # entries since

    def skips(self, few: bool = False) -> bool:
        """Whether this step rests (no offers, no plan). Resting, the steps between plans
        double from REST_EVERY to REST_NEAR, or to REST_DEEPEST while the ledger is far from
        paying, while each plan finds the rest's reason still there; a rest that ends starts
        the next at REST_EVERY. `few`: fewer than REST_FROM requests run, which rest only
        while the long ledger, too, says speculation did not pay (unpaid_long)."""
        works = (self._idle_plans < REST_AFTER and self.pays()) or self.paid_long()
        if works or (few and not self.unpaid_long()):
            self._every = self._wait = REST_EVERY
            return False
        self._wait -= 1
        if self._wait > 0:
            return True
        self._every = min(REST_DEEPEST if self.far() else REST_NEAR, 2 * self._every)
        self._wait = self._every
        return False

    def wake(self) -> None:
        """The next step plans, and a rest that goes on starts again at REST_EVERY (a shadow
        check found a chain that would have paid: the driver's WAKE_ACCEPTED)."""
        self._every = REST_EVERY
        self._wait = 1

    def planned(self, drafted: bool) -> None:
        """A plan ran; whether it drafted anything."""
        self._idle_plans = 0 if drafted else self._idle_plans + 1

    def observed(
        self,
        accepted: int,
        emitted: int,
        plan_seconds: float,
        step_seconds: float,
        drafts: int = 0,
        excess_seconds: float = 0.0,
    ) -> None:
        """A planning step's outcome: its accepted drafts, emitted tokens, the plan's seconds
        and the whole step's (plan included), the drafts it ran and its seconds over the
        predicted step without them (0: no prediction)."""
        entry = (accepted, emitted, plan_seconds, step_seconds, drafts, excess_seconds)
        self._long.append(entry)
        self._return = None
        self._long_new += 1

    def pays(self) -> bool:
        """Whether planning and drafting paid over the last REST_AFTER planning steps (True
        until that many were observed)."""
        return len(self._long) < REST_AFTER or self._returned() >= 1.0

    def far(self) -> bool:
        """Whether the last REST_AFTER planning steps returned under REST_FAR of what their
        planning and drafts cost (False until that many were observed)."""
        return len(self._long) >= REST_AFTER and self._returned() < REST_FAR

    def _returned(self) -> float:
        """The ledger's return share (_return_share), kept until the ledger changes."""
        if self._return is None:
            self._return = _return_share(self._recent())
        return self._return

    def _recent(self) -> list[Entry]:
        """The ledger: the last REST_AFTER planning steps."""
        return [self._long[i] for i in range(-min(REST_AFTER, len(self._long)), 0)]

    def paid_long(self) -> bool:
        """Whether planning and drafting paid over the last REST_HORIZON planning steps (False
        until they hold more than REST_AFTER: the short ledger speaks alone until then).
        Only where planning is cheap (_cheap): elsewhere a rest saves more than it delays.
        Accepted drafts come in runs far apart: code editing copies a span, then writes new
        text for 16 or more steps where nothing is offered or a stray draft fails; a rest
        that began there delayed the next span by up to REST_DEEPEST - 1 steps, into the next
        request. On the Qwen 1.5B at one request this rule ran code editing 1.03-1.07x
        faster (docs/benchmarks.md §5zg). Re-read every REST_AFTER entries (a verdict over
        256 steps moves slowly)."""
        self._reread_long()
        return self._long_paid

    def unpaid_long(self) -> bool:
        """Whether planning and drafting did not pay over the last REST_HORIZON planning steps,
        which hold at least REST_FEW_AFTER: paid_long's verdict without its bound on planning's
        share, which one and two requests need. Their plans are 2-4% of SmolLM2's one-row steps
        here; their rest was a trap where it followed the short ledger, which rested code
        editing between its copied spans (copy 0.907 -> 0.921x off), while chat, whose drafts
        never paid over hundreds of steps, ran 1.034 -> 1.020x off with it
        (docs/benchmarks.md §5zn, §5zo). Re-read with paid_long."""
        self._reread_long()
        return self._long_unpaid

    def _reread_long(self) -> None:
        """paid_long's and unpaid_long's verdicts, read again once REST_AFTER entries came."""
        if self._long_new < REST_AFTER:
            return
        self._long_new = 0
        long = self._long
        paid = _return_share(long) >= 1.0
        self._long_paid = len(long) > REST_AFTER and _cheap(long) and paid
        self._long_unpaid = len(long) >= REST_FEW_AFTER and not paid

    def long_ledger(self) -> tuple[float, float]:
        """The long ledger's return share and its planning's share of its typical steps
        (_cheap's), for benchmarks; (nan, nan) while it is empty."""
        if not self._long:
            return math.nan, math.nan
        return _return_share(self._long), _planning_share(self._long)

    def chain_cap(self, cap: int, whole: int) -> int:
        """A request's chain cap under a resting policy: past SHORT_CHAIN drafts only while the
        ledger says drafts pay, and then up to twice `whole` (its last chain's drafts if all
        were accepted, else 0). Acceptance comes in bursts (a copied span accepts every draft,
        an edit none), which a per-draft rate cannot see: on the Qwen 1.5B at one request long
        chains cut code editing's steps by a tenth or more, while at 16 chat requests on
        SmolLM2, where drafts barely pay, the longer plans cost ~5% (docs/benchmarks.md §5zc)."""
        if cap <= SHORT_CHAIN:
            return cap
        if not self.pays():
            return SHORT_CHAIN
        return min(cap, max(SHORT_CHAIN, 2 * whole))


def _return_share(ledger: Sequence[Entry]) -> float:
    """What the ledger's accepted drafts returned as a share of what its planning and its
    drafts' extra time cost: sum(accepted) * sum(step seconds) / (sum(emitted) * (planning +
    extra)); they paid where it is at least 1 (inf where they cost nothing)."""
    accepted = sum(entry[0] for entry in ledger)
    emitted = sum(entry[1] for entry in ledger)
    planning = sum(entry[2] for entry in ledger)
    seconds = sum(entry[3] for entry in ledger)
    cost = emitted * (planning + _draft_seconds(ledger))
    return accepted * seconds / cost if cost > 0 else math.inf


def _cheap(ledger: Sequence[Entry]) -> bool:
    """Whether the ledger's planning took under REST_MIN_SHARE of its steps, taken as a
    typical step's seconds (the median) times their number, so that prefills among them do
    not dilute the share: a rest could save no more than that. The n-gram proposer's plans
    took 0.7-1.0% of the Qwen 1.5B's 19 ms steps at one request, and 2.4-3.7% of SmolLM2's
    (chat, copy), where without this bound the long ledger cost chat 0.92x and copy 0.85x
    their rates at one request (docs/benchmarks.md §5zg)."""
    return _planning_share(ledger) < REST_MIN_SHARE


def _planning_share(ledger: Sequence[Entry]) -> float:
    """The ledger's planning seconds over its median step's seconds times its steps."""
    steps = sorted(entry[3] for entry in ledger)
    planning = sum(entry[2] for entry in ledger)
    typical = steps[len(steps) // 2] * len(steps)
    return planning / typical if typical > 0 else math.inf


def _draft_seconds(ledger: Sequence[Entry]) -> float:
    """What the ledger's drafts added to their steps: the drafting steps' excess over the
    prediction without drafts, less the model's own bias there, at least 0. The bias is
    relative: the median excess over the prediction of the steps that drafted nothing, as a
    share of their predictions (0 without such steps). An absolute one let a new request's
    prefill, 13 ms under its 143 ms prediction, add 13 ms to each 9 ms drafting step of
    SmolLM2 copying, and the ledger rested copy (docs/benchmarks.md §5zd)."""
    plain = sorted(entry[5] / _predicted(entry) for entry in ledger if entry[4] == 0)
    bias = plain[len(plain) // 2] if plain else 0.0
    extra = sum(entry[5] - bias * _predicted(entry) for entry in ledger if entry[4] > 0)
    return max(0.0, extra)


def _predicted(entry: Entry) -> float:
    """A ledger step's predicted seconds without its drafts (its step seconds less planning
    and the excess), at least a microsecond."""
    _, _, plan_seconds, step_seconds, _, excess_seconds = entry
    return max(1e-6, step_seconds - plan_seconds - excess_seconds)
