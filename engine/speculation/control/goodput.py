"""GoodputPolicy: a draft count per request, every step, maximising expected emitted tokens per
second of step time (DESIGN §6; SmartSpec, arXiv 2406.14066, picks one count per batch, we
pick one per request).

Per request, the acceptance estimate (acceptance.py) gives the gain of each further draft:
chains a^j, trees the path probability of the j-th best node. The cost model predicts the
step's seconds from its features; search.py finds the counts. Until the cost model is fitted,
k cycles through 0..max so the model sees the draft direction, and a request idle for
`explore_interval` plans is given one draft, so an estimate that fell to ~0 can recover
(explore.py: which, and what such a probe may cost).

Under load two corrections keep drafts that only look good from running: the search leaves
the step's sunk work (prefill chunks, decodes that cannot speculate) out of the seconds it
divides by, so a draft is priced at the decoding requests' own goodput (a 200-token chunk
beside one decode made any draft above a = 0.005 look paying); and a proposer's drafts are
valued at its estimates' calibration (acceptance.py: what the drafts run accepted over what
the plan expected, recorded on SpecState.expected). docs/benchmarks.md §5l measures both.
And a plan's drafts must beat the plan without them by DRAFT_MARGIN of predicted goodput
(best responses price drafts at the level times 1 + DRAFT_MARGIN): near break-even, a draft
taxes the requests beside it with its verify rows for little gain (§5m).

Acceptance is estimated per kind of proposal where the proposer names one before the plan
(SpecCandidate.kind: the n-gram match's order). Between full searches, while the batch keeps
its size and shape, each request's k is its best response at the last search's prices
(held_prices.py), which is the search's own stationary condition and costs no cost-model
calls; only where nothing is shared between requests (one proposer, no draft-model passes) and
the token budget does not bind.

Proposer choice (issue #12): with several proposers the policy keeps one acceptance estimate
per request and proposer, gives the search one option per proposer (search.py), and writes
the chosen proposer of each candidate on its record (SpecState.proposer; "" when it does not
speculate). Exploration is per (request, proposer): a proposer not run on a request for
`explore_interval` plans is forced (one draft) now and then, so estimates of proposers that
lost do not freeze. Everything per request lives on the request's SpecState.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from engine.outputs import SpecPlan
from engine.request import SpecState
from engine.speculation.control.acceptance import (
    GRID,
    MAX_TREE_NODES,
    AcceptanceEstimator,
    tree_gains,
)
from engine.speculation.control.cost_model import StepCostModel
from engine.speculation.control.explore import Exploration
from engine.speculation.control.held_prices import HeldPrices
from engine.speculation.control.padded_plans import best_plan
from engine.speculation.control.policy import SpecCandidate, SpecPolicy, SpecResult
from engine.speculation.control.probe_value import could_win
from engine.speculation.control.search import SearchProblem, SearchResult, SearchSlot
from engine.speculation.control.step_features import StepFeatures
from engine.speculation.control.tree_shape import TreeShapeEstimator
from engine.speculation.proposers.proposer import DRAFT_PROPOSER
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

PLAN_DECAY = 0.9  # weight of the previous planning-time estimate
# Drafts run only where the plan's predicted goodput beats the plan without them by this
# share: a draft of about break-even gain costs the requests beside it their verify rows
# whatever it returns, and the estimates behind it are noisy (docs/benchmarks.md §5m).
DRAFT_MARGIN = 0.03


class GoodputPolicy(SpecPolicy):
    """Per-request speculation lengths maximising predicted goodput.

    The plan's goodput counts every decode in the step (those that cannot draft emit their
    one token); prefill chunks in `base` are counted as emitting nothing, their seconds sunk. Until
    the cost model is fitted, k cycles through 0..max_draft_tokens so the model sees the draft direction.
    A request that has not speculated for `explore_interval` plans may be given one draft (one
    such request per plan), so an acceptance estimate that fell to ~0 can recover.
    """

    rests = True  # while its plans do not pay, the driver plans only now and then (rest.py)

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
        graphs: GraphShapes = NO_GRAPHS,
        tree_shape: TreeShapeEstimator | None = None,
        proposers: Sequence[str] = (),
        propose_seconds: dict[str, float] | None = None,
    ) -> None:
        """proposers: the names to choose among (proposer choice); `draft` runs draft-model
        passes. Empty or one name: that proposer only, with draft_model saying whether it
        runs passes (the single-proposer policy). propose_seconds: CPU seconds per request of
        the model-free proposers, a live mapping its owner (ProposerSet) keeps measuring."""
        if max_draft_tokens < 0 or (tree and max_draft_tokens > MAX_TREE_NODES):
            raise ValueError(
                f"max_draft_tokens must be in 0..{MAX_TREE_NODES if tree else 'inf'}: {max_draft_tokens}"
            )
        self.cost_model = cost_model
        self.max_draft_tokens = max_draft_tokens
        self.tree = tree
        self.draft_model = draft_model
        self.graphs = graphs  # the step shapes the runner replays as CUDA graphs
        self.tree_shape = tree_shape  # trees: node gains from the learned shape
        self.token_budget = token_budget
        self.proposers = tuple(proposers) or ("",)
        # One estimate per request and proposer, each with its own global prior.
        self.estimators = {
            name: AcceptanceEstimator(prior, tree=tree, decay=decay, name=name)
            for name in self.proposers
        }
        self.acceptance = self.estimators[self.proposers[0]]
        lagging = (
            n for n in self.proposers if (n == DRAFT_PROPOSER if self.choice else draft_model)
        )
        self.exploration = Exploration(self.estimators, frozenset(lagging), explore_interval)
        self.propose_seconds = propose_seconds if propose_seconds is not None else {}
        self.last_predicted_step_time: float | None = None  # for metrics
        # Seconds a plan takes (an exponential average of this policy's own plans): part of
        # every step's time, so the objective pays it like the step's fixed costs.
        self.plan_seconds = 0.0
        self._catchup_per_token = 0.0  # the cost model's, refreshed every plan
        # The last plan put every request at its cap: the search tries that answer first
        # (where verification is nearly free it is the usual one).
        self._caps_last = False
        self.held = HeldPrices(DRAFT_MARGIN)  # the last full search's prices, between searches

    @property
    def choice(self) -> bool:
        return len(self.proposers) > 1

    @property
    def explore_interval(self) -> int:
        return self.exploration.interval

    @explore_interval.setter
    def explore_interval(self, plans: int) -> None:
        self.exploration.interval = plans

    def rest_step(self) -> None:
        """A step the driver rested counts on the exploration clock as a plan: idle requests
        age by steps, as a draft model's catch-up grows (a token a step). Counted by plans, a
        resting driver (one plan in four) made every probe of a draft model four times dearer
        against its budget, and none came (docs/benchmarks.md §5za)."""
        self.exploration.tick()

    def _options(
        self, candidates: Sequence[SpecCandidate], values: Sequence[float]
    ) -> list[list[SearchSlot]]:
        """Each candidate's option per proposer, whose calibration is `values` this plan."""
        caps = [self._cap(c) for c in candidates]
        columns = [
            self._proposer_options(candidates, caps, name, value)
            for name, value in zip(self.proposers, values)
        ]
        return [list(row) for row in zip(*columns)]

    def _proposer_options(
        self, candidates: Sequence[SpecCandidate], caps: list[int], proposer: str, value: float
    ) -> list[SearchSlot]:
        """Every candidate's option for `proposer`, with at most its cap in `caps` drafts (a
        plan makes one per request and proposer: what is the same for all of them is looked
        up once)."""
        # With one proposer, its passes are the policy's draft_model and its CPU is not priced.
        choice = self.choice
        draft = proposer == DRAFT_PROPOSER if choice else self.draft_model
        extra = self.propose_seconds.get(proposer, 0.0) if choice else 0.0
        name = proposer if choice else ""
        slots, estimator = [], self.estimators[proposer]
        for candidate, cap in zip(candidates, caps):
            kind = candidate.kind
            offered = candidate.offers.get(proposer)
            if offered is not None:  # proposer choice: what it can draft now, its kind
                cap, kind = min(cap, offered[0]), offered[1]
            # A draft model runs one pass per chain position, and one per node it expands in
            # a tree (a pass expands one node of every request), so k drafts cost k passes.
            gains = self._valued_gains(candidate.spec, estimator, kind, cap, value)
            seconds = self._catchup_share(candidate, gains) + extra if draft else extra
            option = SearchSlot(gains, range(1, cap + 1), cap, 0, name, draft, seconds)
            slots.append(option)
        return slots

    def _catchup_seconds(self, candidate: SpecCandidate) -> float:
        """The cost model's seconds for the draft model's catch-up on this request, paid when
        it drafts for it (a linear term, so priced per request like CPU time)."""
        return self._catchup_per_token * candidate.num_catchup_tokens

    def _catchup_share(self, candidate: SpecCandidate, gains: Sequence[float]) -> float:
        """This step's share of the catch-up: once fed, the draft model stays in step for the
        rest of the request, so the catch-up is spread over the steps left at this option's
        expected tokens per step (1 + the gains at its cap). A one-step objective that paid
        it whole would never catch up a draft model that missed a prompt (on the Qwen pair,
        40 chat-prompt tokens cost ~0.12 s, three decode steps). Unknown length: whole."""
        seconds = self._catchup_seconds(candidate)
        if seconds == 0.0 or candidate.num_remaining_tokens <= 0:
            return seconds
        steps_left = candidate.num_remaining_tokens / (1.0 + sum(gains))
        return seconds / max(1.0, steps_left)

    def _price_catchup(self) -> None:
        """The cost model's seconds per catch-up token, once per plan."""
        predict, tokens = self.cost_model.predict, 1024
        fed = predict(StepFeatures(num_catchup_tokens=tokens)) - predict(StepFeatures())
        self._catchup_per_token = max(0.0, fed) / tokens

    def _valued_gains(
        self, spec: SpecState, estimator: AcceptanceEstimator, kind: str, cap: int, value: float
    ) -> list[float]:
        """The gains of drafts 1..cap from the proposer of `estimator` as the search weighs
        them: its estimate's gains (_gains) times `value`, its calibration (the estimates'
        realised share where the policy acted on them; AcceptanceEstimator)."""
        a = estimator.rate(spec, kind)
        if not self.tree:  # the common case inline: a plan makes one per request and proposer
            return [value * a**j for j in range(1, cap + 1)]
        return [value * gain for gain in self._gains(a, cap, estimator.prior(kind))]

    def _record(self, candidate: SpecCandidate, proposer: str, valued: Sequence[float]) -> None:
        """The estimate's expected acceptance of the planned drafts, for its calibration."""
        value = self.estimators[proposer].calibration
        candidate.spec.expected = tuple(gain / value for gain in valued)

    def _gains(self, a: float, cap: int, prior: float) -> Sequence[float]:
        """Chains: a^j. Trees: the learned shape's node path probabilities, scaled by how this
        request's acceptance compares with everyone's (`prior`; rank model, acceptance.py)."""
        if not self.tree:
            return [a**j for j in range(1, cap + 1)]
        if self.tree_shape is None:
            return tree_gains(round(a * GRID))[0]
        scale = min(2.0, a / max(prior, 1e-3))
        scores = self.tree_shape.template(cap)[1]
        return [min(1.0, scale * p) for p in scores] + [0.0] * (cap - len(scores))

    def _explore(
        self,
        candidates: Sequence[SpecCandidate],
        options: list[list[SearchSlot]],
        base: StepFeatures,
        decoding: Sequence[SpecCandidate],
    ) -> None:
        """The probe of this plan (Exploration.probe), if any and if it could pay off
        (probe_value.py, once the cost model is fitted): that request gets only that option,
        with one draft at least."""
        caps = [[o.cap for o in slot] for slot in options]
        fitted = self.cost_model.fitted
        step = self.cost_model.predict(base) if fitted else 0.0

        def cost(i: int, j: int) -> float:
            return self._probe_seconds(candidates[i], options[i][j])

        def worth(i: int, j: int) -> bool:
            sunk = self._sunk_seconds(decoding, base)
            after = self.propose_seconds.get(options[i][j].proposer, 0.0) if self.choice else 0.0
            model, graphs = self.cost_model, self.graphs
            return could_win(options[i], j, base, model, graphs, len(decoding), sunk, after)

        probe = self.exploration.probe(candidates, caps, cost, step, worth if fitted else None)
        if probe is not None:
            i, j = probe
            self.exploration.spend(self.proposers[j], cost(i, j))
            options[i] = [options[i][j]]
            options[i][0].floor = 1

    def _probe_seconds(self, candidate: SpecCandidate, option: SearchSlot) -> float:
        """What a forced probe of this option costs beyond the step: the whole catch-up (a
        probe may show the draft model does not pay, and then nothing is spread)."""
        draft = option.draft if option.draft is not None else self.draft_model
        whole = self._catchup_seconds(candidate) if draft else 0.0
        return whole + self.propose_seconds.get(option.proposer, 0.0)

    def plan(self, decoding: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        """`decoding`: every request decoding this step; those with a cap of 0 cannot draft,
        and their tokens and seconds count in every plan's goodput (SearchProblem.other_tokens)."""
        candidates = [c for c in decoding if c.max_draft_tokens > 0]
        if not candidates:
            return {}
        start = time.perf_counter()
        plan = self._plan(candidates, decoding, base)
        seconds = time.perf_counter() - start
        old = self.plan_seconds
        self.plan_seconds = seconds if old == 0.0 else PLAN_DECAY * old + (1 - PLAN_DECAY) * seconds
        return plan

    def _plan(
        self,
        candidates: Sequence[SpecCandidate],
        decoding: Sequence[SpecCandidate],
        base: StepFeatures,
    ) -> SpecPlan:
        self.exploration.tick()
        if self.draft_model or DRAFT_PROPOSER in self.proposers:
            self._price_catchup()
        if self.held.hold(base):
            plan = self._respond(candidates, base)
            if plan is not None:
                return plan
        values = [self.estimators[name].calibration for name in self.proposers]
        options = self._options(candidates, values)
        self._explore(candidates, options, base, decoding)
        if self.cost_model.fitted:
            problem = SearchProblem(
                options,
                base,
                self.cost_model,
                self.draft_model,
                self.graphs,
                self.token_budget,
                self.plan_seconds,
                self._sunk_seconds(decoding, base),
                caps_first=self._caps_last,
                other_tokens=len(decoding) - len(candidates),
            )
            result = _worth_drafting(problem, best_plan(problem, DRAFT_MARGIN))
            ks, chosen = result.ks, problem.chosen(result.picks)
            self._caps_last = all(k == slot.cap for k, slot in zip(ks, chosen))
            self.last_predicted_step_time = result.predicted_seconds + problem.sunk_seconds
            self.held.take(problem, result, base, not self.choice and not problem.any_draft)
        else:
            warmup_k = self.exploration.clock % (self.max_draft_tokens + 1)
            # Warm-up: proposers in turn, so the cost model sees each one's cost.
            chosen = [o[self.exploration.clock % len(o)] for o in options]
            ks = tuple(max(s.floor, min(warmup_k, s.cap)) for s in chosen)
            self.last_predicted_step_time = None
        plan = {c.request_id: k for c, k in zip(candidates, ks) if k > 0}
        for candidate, slot, k in zip(candidates, chosen, ks):
            name = slot.proposer or self.proposers[0]
            candidate.spec.proposer = name if k > 0 and self.choice else ""
            if self.choice:  # the chosen member's kind, for its result's estimate
                candidate.spec.kind = candidate.offers.get(name, (0, ""))[1] if k > 0 else ""
            candidate.spec.expected = ()
            if k > 0:
                candidate.spec.last_run[name] = self.exploration.clock
                self._record(candidate, name, slot.gains[:k])
        return plan

    def _sunk_seconds(self, decoding: Sequence[SpecCandidate], base: StepFeatures) -> float:
        """The predicted seconds of the step's work beyond its decodes (prefill chunks): it
        emits nothing, and runs whatever the plan."""
        decodes = [(c.context_len - 1, 1, 0) for c in decoding]
        alone = self.cost_model.predict(StepFeatures.from_shapes(decodes, False, self.graphs))
        return max(0.0, self.cost_model.predict(base) - alone)

    # ---- between searches: best responses at the last search's prices -------------------
    def _respond(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan | None:
        """Each request's best response at the held prices (a forced probe keeps its one
        draft), the plan's step predicted once (metrics); None when the token budget binds
        (the search decides which drafts go)."""
        self.held.plans_since_search += 1
        name = self.proposers[0]
        estimator = self.estimators[name]
        value = estimator.calibration
        caps = [self._cap(c) for c in candidates]
        probe = self.exploration.probe(candidates, [[cap] for cap in caps])
        ks, valued = [], []
        for i, (candidate, cap) in enumerate(zip(candidates, caps)):
            gains = self._valued_gains(candidate.spec, estimator, candidate.kind, cap, value)
            floor = 1 if probe is not None and probe[0] == i else 0
            ks.append(self.held.respond(gains, cap, floor))
            valued.append(gains)
        drafts = sum(ks)
        if self.token_budget is not None and base.num_batched_tokens + drafts > self.token_budget:
            self.held.drop()
            return None
        plan = {c.request_id: k for c, k in zip(candidates, ks) if k > 0}
        for candidate, k, gains in zip(candidates, ks, valued):
            candidate.spec.expected = ()
            if k > 0:
                candidate.spec.last_run[name] = self.exploration.clock
                self._record(candidate, name, gains[:k])
        features = base.with_drafts(drafts, len(plan), 0, self.graphs, max(ks, default=0))
        self.last_predicted_step_time = self.cost_model.predict(features) + self.plan_seconds
        return plan

    def _cap(self, candidate: SpecCandidate) -> int:
        return max(0, min(self.max_draft_tokens, candidate.max_draft_tokens))

    def observe(
        self, results: Sequence[SpecResult], features: StepFeatures, step_seconds: float
    ) -> None:
        self.cost_model.observe(features, step_seconds)
        for result in results:
            estimator = self.estimators.get(result.proposer, self.acceptance)
            if result.shadow:  # checked, not run: as good as a probe, and it cost none
                name = result.proposer if result.proposer in self.estimators else self.proposers[0]
                result.spec.last_run[name] = self.exploration.clock
            else:
                expected = result.spec.expected[: result.num_draft_tokens]
                estimator.calibrate(sum(expected), result.num_accepted_tokens)
            estimator.update(result)

    def rate(self, spec: SpecState, proposer: str = "", kind: str = "") -> float:
        """A request's acceptance estimate for a proposer (chains: per draft token; trees:
        rank-1) and proposals of a kind; "" or a name it does not choose among: its first."""
        return self.estimators.get(proposer, self.acceptance).rate(spec, kind)


def _worth_drafting(problem: SearchProblem, found: SearchResult) -> SearchResult:
    """The search's plan where it beats its floors (no drafts but forced probes) by
    DRAFT_MARGIN, else the floors."""
    floors = [options[0].floor for options in problem.options]
    if list(found.ks) == floors:
        return found
    without = problem.evaluate(floors)
    return found if found.goodput >= without.goodput * (1.0 + DRAFT_MARGIN) else without
