"""GoodputPolicy: a draft count per request, every step, maximising expected emitted tokens per
second of step time (DESIGN §6; SmartSpec, arXiv 2406.14066, picks one count per batch, we
pick one per request).

Per request, the acceptance estimate (acceptance.py) gives the gain of each further draft:
chains a^j, trees the path probability of the j-th best node. The cost model predicts the
step's seconds from its features; search.py finds the counts. Until the cost model is fitted,
k cycles through 0..max so the model sees the draft direction, and a request idle for
`explore_interval` plans is given one draft, so an estimate that fell to ~0 can recover.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.outputs import SpecPlan
from engine.speculation.acceptance import GRID, MAX_TREE_NODES, AcceptanceEstimator, tree_gains
from engine.speculation.cost_model import StepCostModel
from engine.speculation.policy import SpecCandidate, SpecResult
from engine.speculation.search import SearchProblem, SearchSlot, best_lengths
from engine.speculation.step_features import StepFeatures
from engine.speculation.tree_shape import TreeShapeEstimator


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
        graphs: bool = False,
        tree_shape: TreeShapeEstimator | None = None,
    ) -> None:
        if max_draft_tokens < 0 or (tree and max_draft_tokens > MAX_TREE_NODES):
            raise ValueError(
                f"max_draft_tokens must be in 0..{MAX_TREE_NODES if tree else 'inf'}: {max_draft_tokens}"
            )
        self.cost_model = cost_model
        self.max_draft_tokens = max_draft_tokens
        self.tree = tree
        self.draft_model = draft_model
        self.graphs = graphs  # the runner replays decode graphs: a verify step is eager
        self.tree_shape = tree_shape  # trees: node gains from the learned shape
        self.explore_interval = explore_interval
        self.token_budget = token_budget
        self.acceptance = AcceptanceEstimator(prior, tree=tree, decay=decay)
        self._num_plans = 0
        self._last_speculated: dict[str, int] = {}
        self.last_predicted_step_time: float | None = None  # for metrics

    def _slot(self, candidate: SpecCandidate) -> SearchSlot:
        cap = max(0, min(self.max_draft_tokens, candidate.max_draft_tokens))
        a = self.acceptance.rate(candidate.request_id)
        # A draft model runs one pass per chain position, and one per node it expands in a
        # tree (a pass expands one node of every request), so k drafts cost k passes.
        return SearchSlot(self._gains(candidate.request_id, a, cap), range(1, cap + 1), cap)

    def _gains(self, request_id: str, a: float, cap: int) -> Sequence[float]:
        """Chains: a^j. Trees: the learned shape's node path probabilities, scaled by how this
        request's acceptance compares with everyone's (rank model, acceptance.py)."""
        if not self.tree:
            return [a**j for j in range(1, cap + 1)]
        if self.tree_shape is None:
            return tree_gains(round(a * GRID))[0]
        scale = min(2.0, a / max(self.acceptance.prior(), 1e-3))
        scores = self.tree_shape.template(cap)[1]
        return [min(1.0, scale * p) for p in scores] + [0.0] * (cap - len(scores))

    def _explore(self, candidates: Sequence[SpecCandidate], slots: list[SearchSlot]) -> None:
        """Give one draft to the request idle longest, once idle for explore_interval plans.
        One per plan, so that under load the retries do not all land on the same step."""
        idle = []
        for i, candidate in enumerate(candidates):
            last = self._last_speculated.setdefault(candidate.request_id, self._num_plans)
            if slots[i].cap > 0 and self._num_plans - last >= self.explore_interval:
                idle.append((last, i))
        if idle:
            slots[min(idle)[1]].floor = 1

    def plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        self._num_plans += 1
        slots = [self._slot(c) for c in candidates]
        self._explore(candidates, slots)
        if self.cost_model.fitted:
            problem = SearchProblem(
                slots, base, self.cost_model, self.draft_model, self.graphs, self.token_budget
            )
            result = best_lengths(problem)
            ks = result.ks
            self.last_predicted_step_time = result.predicted_seconds
        else:
            warmup_k = self._num_plans % (self.max_draft_tokens + 1)
            ks = tuple(max(s.floor, min(warmup_k, s.cap)) for s in slots)
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
