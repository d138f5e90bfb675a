"""Goodput-driven speculation lengths: a k per request, every step (DESIGN §6).

SmartSpec (arXiv 2406.14066) picks one speculation length per batch to maximise goodput, the
expected emitted tokens per second of step time. We pick k_i per request:

    maximise  sum_i E_i(k_i) / T(base + drafts(k))   over  0 <= k_i <= max_k_i

E_i(k) = 1 + sum_{j=1..k} g_i(j), where g_i(j) is the probability that the j-th draft token
(or tree node, in best-first order) is accepted. Chains, Bernoulli(a_i) per position:
g_i(j) = a_i^j, so E_i(k) = (1 - a_i^(k+1)) / (1 - a_i). The gains shrink with j, so a greedy
search that adds one draft where goodput improves most, and closes a request once its next
draft no longer pays, is cheap (two cost-model calls per draft added or request closed).

Trees: per-node gains come from the rank model in acceptance.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from engine.outputs import SpecPlan
from engine.speculation.acceptance import GRID, MAX_TREE_NODES, AcceptanceEstimator, tree_gains
from engine.speculation.cost_model import StepCostModel
from engine.speculation.policy import SpecCandidate, SpecResult
from engine.speculation.step_features import StepFeatures


@dataclass
class SearchSlot:
    """One candidate during the search: marginal gains/depths of drafts 1..cap, chosen k."""

    gains: Sequence[float]
    depths: Sequence[int]
    cap: int
    k: int = 0


@dataclass(frozen=True)
class SearchResult:
    ks: tuple[int, ...]
    predicted_seconds: float
    goodput: float  # expected emitted tokens per second


@dataclass
class _Totals:
    """Running totals of the plan being built (the draft side of the step's features)."""

    base: StepFeatures
    draft_model: bool
    emitted: float = 0.0
    num_draft_tokens: int = 0
    num_spec: int = 0
    steps: int = 0  # deepest draft, i.e. draft-model passes

    def features(self, slot: SearchSlot | None = None) -> StepFeatures:
        """The step's features now, or after `slot` gets one more draft."""
        added = slot is not None
        steps = max(self.steps, slot.depths[slot.k]) if added else self.steps
        spec = self.num_spec + (added and slot.k == 0)
        return self.base.with_drafts(
            self.num_draft_tokens + added, spec, steps if self.draft_model else 0
        )

    def add(self, slot: SearchSlot) -> None:
        self.emitted += slot.gains[slot.k]
        self.num_spec += slot.k == 0
        self.steps = max(self.steps, slot.depths[slot.k])
        self.num_draft_tokens += 1
        slot.k += 1


def greedy_lengths(
    slots: list[SearchSlot],
    base: StepFeatures,
    cost_model: StepCostModel,
    draft_model: bool = False,
    token_budget: int | None = None,
) -> SearchResult:
    """Greedy marginal search for sum E_i / T (module docstring); slots start at forced ks."""
    totals = _Totals(base, draft_model, emitted=sum(1.0 + sum(s.gains[: s.k]) for s in slots))
    totals.num_draft_tokens = sum(s.k for s in slots)
    totals.num_spec = sum(1 for s in slots if s.k > 0)
    totals.steps = max((s.depths[s.k - 1] for s in slots if s.k > 0), default=0)
    seconds = cost_model.predict(totals.features())
    goodput = totals.emitted / seconds
    # Two heaps by marginal gain: a request's first draft also pays the per-request cost.
    speculating = [(-s.gains[s.k], i) for i, s in enumerate(slots) if 0 < s.k < s.cap]
    fresh = [(-s.gains[0], i) for i, s in enumerate(slots) if s.k == 0 and s.cap > 0]
    heapq.heapify(speculating)
    heapq.heapify(fresh)
    budget = token_budget if token_budget is not None else 1 << 62
    while (speculating or fresh) and base.num_batched_tokens + totals.num_draft_tokens < budget:
        options = []
        for heap in (h for h in (speculating, fresh) if h):
            slot = slots[heap[0][1]]
            new_seconds = cost_model.predict(totals.features(slot))
            options.append(((totals.emitted + slot.gains[slot.k]) / new_seconds, new_seconds, heap))
        new_goodput, new_seconds, heap = max(options, key=lambda option: option[0])
        _, index = heapq.heappop(heap)
        if new_goodput <= goodput * (1.0 + 1e-9):
            continue  # close: later drafts only raise goodput, so this one never pays again
        totals.add(slots[index])
        seconds, goodput = new_seconds, new_goodput
        if slots[index].k < slots[index].cap:
            heapq.heappush(speculating, (-slots[index].gains[slots[index].k], index))
    return SearchResult(tuple(s.k for s in slots), seconds, goodput)


class GoodputPolicy:
    """Per-request speculation lengths maximising predicted goodput (engine SpecPolicy).

    Non-candidate requests in `base` (prefill chunks) are counted as emitting nothing. Until
    the cost model is fitted, k cycles through 0..max_draft_tokens so the model sees the draft direction.
    A request that has not speculated for `explore_interval` plans may be given one draft (one
    such request per plan), so an acceptance estimate that fell to ~0 can recover.
    """

    def __init__(
        self,
        cost_model: StepCostModel,
        max_draft_tokens: int,
        prior: float = 0.5,
        tree: bool = False,
        draft_model: bool = False,
        explore_interval: int = 16,
        token_budget: int | None = None,
        decay: float = 0.9,
    ) -> None:
        if max_draft_tokens < 0 or (tree and max_draft_tokens > MAX_TREE_NODES):
            raise ValueError(
                f"max_draft_tokens must be in 0..{MAX_TREE_NODES if tree else 'inf'}: {max_draft_tokens}"
            )
        self.cost_model = cost_model
        self.max_draft_tokens = max_draft_tokens
        self.tree = tree
        self.draft_model = draft_model
        self.explore_interval = explore_interval
        self.token_budget = token_budget
        self.acceptance = AcceptanceEstimator(prior, tree=tree, decay=decay)
        self._num_plans = 0
        self._last_speculated: dict[str, int] = {}
        self.last_predicted_step_time: float | None = None  # for metrics

    def _slot(self, candidate: SpecCandidate) -> SearchSlot:
        cap = max(0, min(self.max_draft_tokens, candidate.max_draft_tokens))
        a = self.acceptance.rate(candidate.request_id)
        if self.tree:
            gains, depths = tree_gains(round(a * GRID))
        else:
            gains, depths = [a**j for j in range(1, cap + 1)], range(1, cap + 1)
        return SearchSlot(gains, depths, cap)

    def _explore(self, candidates: Sequence[SpecCandidate], slots: list[SearchSlot]) -> None:
        """Give one draft to the request idle longest, once idle for explore_interval plans.
        One per plan, so that under load the retries do not all land on the same step."""
        idle = []
        for i, candidate in enumerate(candidates):
            last = self._last_speculated.setdefault(candidate.request_id, self._num_plans)
            if slots[i].cap > 0 and self._num_plans - last >= self.explore_interval:
                idle.append((last, i))
        if idle:
            slots[min(idle)[1]].k = 1

    def plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        self._num_plans += 1
        slots = [self._slot(c) for c in candidates]
        self._explore(candidates, slots)
        if self.cost_model.fitted:
            result = greedy_lengths(
                slots, base, self.cost_model, self.draft_model, self.token_budget
            )
            ks = result.ks
            self.last_predicted_step_time = result.predicted_seconds
        else:
            warmup_k = self._num_plans % (self.max_draft_tokens + 1)
            ks = tuple(min(warmup_k, s.cap) for s in slots)
            self.last_predicted_step_time = None
        plan = {c.request_id: k for c, k in zip(candidates, ks) if k > 0}
        for request_id in plan:
            self._last_speculated[request_id] = self._num_plans
        return plan

    def observe(
        self, results: Sequence[SpecResult], features: StepFeatures, step_seconds: float
    ) -> None:
        self.cost_model.observe(features, step_seconds)
        for result in results:
            self.acceptance.update(result)

    def release(self, request_id: str) -> None:
        self.acceptance.release(request_id)
        self._last_speculated.pop(request_id, None)

    def acceptance_rates(self) -> dict[str, float]:
        """Per-request acceptance estimates (chains: per draft token; trees: rank-1)."""
        return self.acceptance.rates()
