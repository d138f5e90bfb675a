"""GoodputPolicy: a draft count per request, every step, maximising expected emitted tokens per
second of step time (DESIGN §6; SmartSpec, arXiv 2406.14066, picks one count per batch, we
pick one per request).

Per request, the acceptance estimate (acceptance.py) gives the gain of each further draft:
chains a^j, trees the path probability of the j-th best node. The cost model predicts the
step's seconds from its features; search.py finds the counts. Until the cost model is fitted,
k cycles through 0..max so the model sees the draft direction, and a request idle for
`explore_interval` plans is given one draft, so an estimate that fell to ~0 can recover, when
that probe's extra seconds (a draft model's catch-up) are within EXPLORE_SHARE of the idle
plans' steps.

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
(SpecCandidate.kind: the n-gram match's order). Between full searches, for up to REPRICE_EVERY
plans while the batch keeps its size and shape, each request's k is its best response at the
last search's prices (search.Prices: the goodput level and the marginal seconds of a draft and
of a speculating request; with a draft model, only where two requests or more share its
passes, and a draft-model chain stays within them), which is the search's own stationary
condition and costs no cost-model calls; with proposer choice each request's response is
over its options. The prices are kept while those responses make about the search's goodput
(HOLD_TOLERANCE) and used while the token budget does not bind and the responses need no
more passes than the plan runs.
The plan's options are built once per plan as arrays (plan_options.py), so a response costs
no Python object per option.

Proposer choice (issue #12): with several proposers the policy keeps one acceptance estimate
per request and proposer, gives the search one option per proposer (search.py), and writes
the chosen proposer of each candidate on its record (SpecState.proposer; "" when it does not
speculate). Exploration is per (request, proposer): a proposer not run on a request for
`explore_interval` plans is forced (one draft) now and then, so estimates of proposers that
lost do not freeze. Everything per request lives on the request's SpecState.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from engine.outputs import SpecPlan
from engine.request import SpecState
from engine.speculation.control.acceptance import (
    GRID,
    MAX_TREE_NODES,
    AcceptanceEstimator,
    tree_gains,
)
from engine.speculation.control.cost_model import StepCostModel
from engine.speculation.control.padded_plans import best_plan, plan_prices
from engine.speculation.control.plan_options import PlanOptions
from engine.speculation.control.policy import SpecCandidate, SpecPolicy, SpecResult
from engine.speculation.control.search import (
    Prices,
    SearchProblem,
    SearchResult,
)
from engine.speculation.control.step_features import StepFeatures
from engine.speculation.control.tree_shape import TreeShapeEstimator
from engine.speculation.proposers.proposer import DRAFT_PROPOSER
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

PLAN_DECAY = 0.9  # weight of the previous planning-time estimate
# Between full searches, each request's k is its best response at the last search's prices
# (search.Prices) for up to this many plans, while the batch keeps about its size and shape.
REPRICE_EVERY = 8
# A forced probe may cost at most this share of the time since the probed (request, proposer)
# last ran: a draft model's probe first feeds everything it missed (hundreds of tokens after a
# long idle spell), and probing it every explore_interval plans regardless cost auto a third
# of its speed on the Qwen pair (docs/benchmarks.md §4g).
EXPLORE_SHARE = 0.05
# Drafts run only where the plan's predicted goodput beats the plan without them by this
# share: a draft of about break-even gain costs the requests beside it their verify rows
# whatever it returns, and the estimates behind it are noisy (docs/benchmarks.md §5m).
DRAFT_MARGIN = 0.03
# The last search's prices are held while the best responses at them make a plan within this
# share of the search's predicted goodput.
HOLD_TOLERANCE = 0.01


class GoodputPolicy(SpecPolicy):
    """Per-request speculation lengths maximising predicted goodput.

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
        self.explore_interval = explore_interval
        self.token_budget = token_budget
        self.proposers = tuple(proposers) or ("",)
        # One estimate per request and proposer, each with its own global prior.
        self.estimators = {
            name: AcceptanceEstimator(prior, tree=tree, decay=decay, name=name)
            for name in self.proposers
        }
        self.acceptance = self.estimators[self.proposers[0]]
        self._members = [self.estimators[name] for name in self.proposers]  # in order
        self._drafting = tuple(self._runs_draft(name) for name in self.proposers)
        self.propose_seconds = propose_seconds if propose_seconds is not None else {}
        self._num_plans = 0
        self.last_predicted_step_time: float | None = None  # for metrics
        # Seconds a plan takes (an exponential average of this policy's own plans): part of
        # every step's time, so the objective pays it like the step's fixed costs.
        self.plan_seconds = 0.0
        self._catchup_per_token = 0.0  # the cost model's, refreshed every plan
        # The last plan put every request at its cap: the search tries that answer first
        # (where verification is nearly free it is the usual one).
        self._caps_last = False
        # The last full search's prices and the step they were taken at (None: search).
        self._prices: Prices | None = None
        self._priced_base = StepFeatures()
        self._plans_since_search = 0

    @property
    def choice(self) -> bool:
        return len(self.proposers) > 1

    def _options(self, candidates: Sequence[SpecCandidate]) -> PlanOptions:
        """Every candidate's option per proposer: what the proposer can draft now (its offer,
        else the candidate's cap), each draft's gain at the estimate for the offer's kind
        times the proposer's calibration (the estimates' realised share where the policy
        acted on them; AcceptanceEstimator), and the CPU seconds of drafting: a model-free
        proposer's measured seconds, a draft model's share of its catch-up. A draft model
        runs one pass per chain position, and one per node it expands in a tree (a pass
        expands one node of every request), so k drafts cost k passes."""
        names, estimators, draft = self.proposers, self._members, self._drafting
        values = tuple(estimator.calibration for estimator in estimators)
        caps, rates, kinds = [], [], []
        for candidate in candidates:
            cap, spec, offers = self._cap(candidate), candidate.spec, candidate.offers
            for name, estimator in zip(names, estimators):
                offered = offers.get(name)
                kind = candidate.kind if offered is None else offered[1]
                caps.append(cap if offered is None else min(cap, offered[0]))
                rates.append(estimator.rate(spec, kind))
                kinds.append(kind)
        cpu = [self.propose_seconds.get(name, 0.0) for name in names] * len(candidates)
        options = PlanOptions(names, draft, values, rates, caps, [0] * len(caps), cpu)
        if self.tree:
            options.nodes = [
                self._gains(a, cap, self.estimators[names[at % len(names)]].prior(kind))
                for at, (a, cap, kind) in enumerate(zip(rates, caps, kinds))
            ]
        if any(draft):
            for i, candidate in enumerate(candidates):
                for j in (j for j, runs in enumerate(draft) if runs):
                    share = self._catchup_share(candidate, options.gains(i, j))
                    options.seconds[i * len(names) + j] += share
        return options

    def _runs_draft(self, proposer: str) -> bool:
        return proposer == DRAFT_PROPOSER if self.choice else self.draft_model

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

    def _gains(self, a: float, cap: int, prior: float) -> Sequence[float]:
        """Trees: the learned shape's node path probabilities, scaled by how this request's
        acceptance compares with everyone's (`prior`; rank model, acceptance.py)."""
        if self.tree_shape is None:
            return tree_gains(round(a * GRID))[0]
        scale = min(2.0, a / max(prior, 1e-3))
        scores = self.tree_shape.template(cap)[1]
        return [min(1.0, scale * p) for p in scores] + [0.0] * (cap - len(scores))

    def _explore(
        self, candidates: Sequence[SpecCandidate], options: PlanOptions, base: StepFeatures
    ) -> None:
        """The probe of this plan (_probe), if any: that request gets only that option, with
        one draft at least."""

        def cost(i: int, j: int) -> float:
            """A probe's seconds beyond the step: the whole catch-up (a probe may show the
            draft model does not pay, and then nothing is spread)."""
            whole = self._catchup_seconds(candidates[i]) if options.draft[j] else 0.0
            return whole + self.propose_seconds.get(self.proposers[j], 0.0)

        predicted: list[float] = []

        def step() -> float:  # predicted once, and only where a costly probe is weighed
            if not predicted:
                predicted.append(self.cost_model.predict(base) if self.cost_model.fitted else 0.0)
            return predicted[0]

        probe = self._probe(candidates, options.caps, cost, step)
        if probe is not None:
            options.force(*probe)

    def _probe(
        self,
        candidates: Sequence[SpecCandidate],
        caps: Sequence[int],
        cost: Callable[[int, int], float],
        step: Callable[[], float],
    ) -> tuple[int, int] | None:
        """The (request, proposer) idle longest, once idle for explore_interval plans (past
        four candidates, for four plans per candidate, so that under load the retries stay
        about one per four plans: each is a verify row every request in the step waits for),
        to be given one draft. One per plan, so that under load the retries do not all land
        on the same step. caps[i * len(proposers) + j]: proposer j's cap on request i;
        cost(i, j): the seconds of drafting with it beyond the step (a draft model's
        catch-up), which must stay within EXPLORE_SHARE of the idle plans' steps (step()
        seconds each); of all plans so far while the proposer has never been verified."""
        interval = self.explore_interval
        if len(candidates) > 4:
            interval = max(interval, 4 * len(candidates))
        idle, m = [], len(self.proposers)
        for i, candidate in enumerate(candidates):
            for j, name in enumerate(self.proposers):
                # the plan that last ran it on this request (or first saw the request)
                last = candidate.spec.last_run.setdefault(name, self._num_plans)
                idle_plans = self._num_plans - last
                if caps[i * m + j] <= 0 or idle_plans < interval:
                    continue
                seconds = cost(i, j)  # only where it could run
                # A proposer never verified anywhere is budgeted on every plan so far, not
                # this request's: its prior is a guess every later choice of it rests on.
                budget = idle_plans if self.estimators[name].num_updates else self._num_plans
                if seconds == 0.0 or seconds <= EXPLORE_SHARE * budget * step():
                    idle.append((last, i, j))
        return min(idle)[1:] if idle else None

    def plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        start = time.perf_counter()
        plan = self._plan(candidates, base)
        seconds = time.perf_counter() - start
        old = self.plan_seconds
        self.plan_seconds = seconds if old == 0.0 else PLAN_DECAY * old + (1 - PLAN_DECAY) * seconds
        return plan

    def _plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        self._num_plans += 1
        if self.draft_model or DRAFT_PROPOSER in self.proposers:
            self._price_catchup()
        options = self._options(candidates)
        self._explore(candidates, options, base)
        responded = self._respond(options, base) if self._prices_hold(base) else None
        if responded is not None:
            ks, picks = responded
        elif self.cost_model.fitted:
            ks, picks = self._search(candidates, options, base)
        else:
            ks, picks = self._warm_up(options)
        for i, (candidate, j, k) in enumerate(zip(candidates, picks, ks)):
            name = self.proposers[j]
            candidate.spec.proposer = name if k > 0 and self.choice else ""
            if self.choice:  # the chosen member's kind, for its result's estimate
                candidate.spec.kind = candidate.offers.get(name, (0, ""))[1] if k > 0 else ""
            candidate.spec.expected = ()
            if k > 0:  # the estimate's expected acceptance of its drafts, for its calibration
                candidate.spec.last_run[name] = self._num_plans
                candidate.spec.expected = options.expected(i, j, k)
        return {c.request_id: k for c, k in zip(candidates, ks) if k > 0}

    def _warm_up(self, options: PlanOptions) -> tuple[list[int], list[int]]:
        """Until the cost model is fitted: k cycles through 0..max_draft_tokens, proposers
        in turn, so the cost model sees each one's cost."""
        warmup_k = self._num_plans % (self.max_draft_tokens + 1)
        ks, picks = [], []
        for slots in options.slots():
            slot = slots[self._num_plans % len(slots)]
            ks.append(max(slot.floor, min(warmup_k, slot.cap)))
            picks.append(self.proposers.index(slot.proposer))
        self.last_predicted_step_time = None
        return ks, picks

    def _search(
        self, candidates: Sequence[SpecCandidate], options: PlanOptions, base: StepFeatures
    ) -> tuple[Sequence[int], list[int]]:
        """The goodput search's plan (ks, the proposer chosen per candidate); its prices
        kept."""
        problem = SearchProblem(
            options.slots(),
            base,
            self.cost_model,
            self.draft_model,
            self.graphs,
            self.token_budget,
            self.plan_seconds,
            self._sunk_seconds(candidates, base),
            caps_first=self._caps_last,
        )
        result = _worth_drafting(problem, best_plan(problem, DRAFT_MARGIN))
        chosen = problem.chosen(result.picks)
        self._caps_last = all(k == slot.cap for k, slot in zip(result.ks, chosen))
        self.last_predicted_step_time = result.predicted_seconds + problem.sunk_seconds
        self._take_prices(problem, options, result, base)
        return result.ks, [self.proposers.index(slot.proposer) for slot in chosen]

    def _sunk_seconds(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> float:
        """The predicted seconds of the step's work beyond the candidates' decoding (prefill
        chunks, other decodes): it emits nothing the search counts, and runs anyway."""
        decoding = [(c.context_len - 1, 1, 0) for c in candidates]
        alone = self.cost_model.predict(StepFeatures.from_shapes(decoding, False, self.graphs))
        return max(0.0, self.cost_model.predict(base) - alone)

    # ---- between searches: best responses at the last search's prices -------------------
    def _take_prices(
        self, problem: SearchProblem, options: PlanOptions, result: SearchResult, base: StepFeatures
    ) -> None:
        """Keep the search's prices where the best responses at them (as _respond prices
        them) make a plan of about the search's predicted goodput (within HOLD_TOLERANCE).
        Prices are the step's marginal seconds just past the plan; where the step time is
        not linear there (a row knot, as on the Qwen 1.5B from 5 to 6 rows, one more draft
        after a batch-1 chain of 4) they price every draft at the jump, and the responses
        would drop drafts the search found paying (docs/benchmarks.md §5n): then the next
        plan searches again. They need not be the plan itself: each response's drafts must
        beat the level by DRAFT_MARGIN, the search's only the plan's as a whole."""
        prices = plan_prices(problem, result) if result.goodput > 0 else None
        if prices is not None:
            ks, picks = options.responses(prices, DRAFT_MARGIN)
            seconds = self._seconds(base, options, ks, picks) + problem.extra_seconds
            if options.emitted(ks, picks) / seconds < (1.0 - HOLD_TOLERANCE) * result.goodput:
                prices = None
        self._prices = prices
        self._priced_base, self._plans_since_search = base, 0

    def _prices_hold(self, base: StepFeatures) -> bool:
        """The last prices still price this step: few plans since, about the same batch (size
        within a quarter, the same eager or replayed step)."""
        if self._prices is None or self._plans_since_search >= REPRICE_EVERY - 1:
            return False
        then = self._priced_base
        size = max(1, then.num_requests // 4)
        return (
            abs(base.num_requests - then.num_requests) <= size
            and base.num_eager_steps == then.num_eager_steps
            and abs(base.num_batched_tokens - then.num_batched_tokens)
            <= max(1, then.num_batched_tokens // 4)
        )

    def _respond(
        self, options: PlanOptions, base: StepFeatures
    ) -> tuple[list[int], list[int]] | None:
        """Each request's best response at the held prices (a forced probe keeps its one
        draft), the plan's step predicted once (metrics); None where the prices cannot price
        it (the token budget binds, or a probe needs more draft-model passes than the plan
        runs): the search decides."""
        self._plans_since_search += 1
        ks, picks = options.responses(self._prices, DRAFT_MARGIN)
        budget = self.token_budget
        if options.passes(ks, picks) > self._prices.passes or (
            budget is not None and base.num_batched_tokens + sum(ks) > budget
        ):
            self._prices = None
            return None
        self.last_predicted_step_time = self._seconds(base, options, ks, picks) + self.plan_seconds
        return ks, picks

    def _seconds(
        self, base: StepFeatures, options: PlanOptions, ks: list[int], picks: list[int]
    ) -> float:
        """The step's predicted seconds with these drafts, the options' CPU seconds included
        (as SearchProblem.evaluate, before its corrections)."""
        spec = sum(1 for k in ks if k > 0)
        passes = options.passes(ks, picks)
        features = base.with_drafts(sum(ks), spec, passes, self.graphs, max(ks, default=0))
        return self.cost_model.predict(features) + options.cpu_seconds(ks, picks)

    def _cap(self, candidate: SpecCandidate) -> int:
        return max(0, min(self.max_draft_tokens, candidate.max_draft_tokens))

    def observe(
        self, results: Sequence[SpecResult], features: StepFeatures, step_seconds: float
    ) -> None:
        self.cost_model.observe(features, step_seconds)
        for result in results:
            estimator = self.estimators.get(result.proposer, self.acceptance)
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
