"""SpecDriver: the engine's speculation steps (plan, propose, observe) around one proposer
(or a ProposerSet, whose member the goodput policy chooses per request: issue #12) and one
policy (DESIGN §1 steps 1, 3 and 6). With no proposer configured every call is a no-op
and the plan is empty, so the scheduler never reserves draft slots.

The driver holds no engine objects: plan() gets the running requests, propose() and observe()
the step's contracts. What speculation knows of a request (its counts, acceptance estimates,
chosen proposer, proposers' memos) lives on the request's SpecState, so nothing here is freed
when a request finishes; a preempted request's memos are cleared. engine/speculation/build.py
builds the driver (the proposer for the target, the policy, the cost model seeded by a
start-up profile).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from engine.config import SpecConfig
from engine.outputs import (
    Drafts,
    DraftTree,
    ModelOutput,
    ScheduledRequest,
    SchedulerOutput,
    SpecPlan,
)
from engine.request import Request, RequestStatus
from engine.speculation.control.cost_model import OnlineLinearCostModel
from engine.speculation.control.policy import SpecCandidate, SpecPolicy, SpecResult
from engine.speculation.control.profiler import SeedReport
from engine.speculation.control.rest import REST_FROM, PlanningRest, batch_class
from engine.speculation.control.step_features import StepFeatures
from engine.speculation.control.tree_shape import TreeShapeEstimator, accepted_path
from engine.speculation.proposers.proposer import (
    DRAFT_PROPOSER,
    Observation,
    Proposer,
    ProposeRequest,
    observes,
)
from engine.speculation.shadow import ShadowChecks
from engine.speculation.tally import SpecTally
from kernels.graph_shapes import NO_GRAPHS, GraphShapes

# Resting, the driver tends a step (starts and feeds the shadow checks, observes the step's
# requests, feeds the policy and its cost model) on the first rested step after a plan and on
# one in this many after it; the others only count their tokens. Tended every step, a resting
# driver cost 0.08-0.10 ms a step of SmolLM2's ~5 ms at two requests, and goodput resting ran
# 1.02-1.05x off's steps (docs/benchmarks.md §5zq); tended one in four, 0.093 against 0.120 in
# one run (§5zr). The checks lose nothing between turns, as they read the request's tokens when
# fed (engine/speculation/shadow.py), and a chain that would have paid wakes the rest a turn
# later.
REST_SEEN_EVERY = 4
# A shadow check on a rested step that would have had this many drafts accepted wakes the rest
# (the next step plans): resting, plans come up to 64 steps apart, and after a workload turns
# from chat to copying a rest begun on chat outlasted whole Poisson cells of copying requests
# (docs/benchmarks.md §5zp).
WAKE_ACCEPTED = 4


def max_draft_tokens(config: SpecConfig) -> int:
    """The engine's cap: tree nodes for trees, tokens for chains."""
    return config.spec_tree_nodes if config.spec_tree_nodes > 0 else config.chain_cap


def speculates(config: SpecConfig, proposer: Proposer | None) -> bool:
    """Whether any request may speculate (a request may still turn it off)."""
    return proposer is not None and config.policy != "off" and max_draft_tokens(config) > 0


class SpecDriver:
    def __init__(
        self,
        config: SpecConfig,
        proposer: Proposer | None,
        policy: SpecPolicy,
        cost_model: OnlineLinearCostModel,
        tree_shape: TreeShapeEstimator | None,
        token_budget: int,
        max_num_seqs: int = 1 << 30,
        graphs: GraphShapes = NO_GRAPHS,
        shadows: ShadowChecks | None = None,
    ) -> None:
        """Built by engine/speculation/build.py; graphs: the step shapes the runner replays
        as CUDA graphs, as this driver's plans may use them (trees: decode steps only);
        shadows: the model-free proposers whose chains are checked, not verified, where they
        do not draft (engine/speculation/shadow.py)."""
        self.config = config
        self.token_budget, self.max_num_seqs = token_budget, max_num_seqs
        self.tree = config.spec_tree_nodes > 0
        self.graphs = graphs
        self.draft_model = DRAFT_PROPOSER in config.proposers
        self.choice = len(config.proposers) > 1  # proposer is a ProposerSet
        self.max_draft_tokens = max_draft_tokens(config)
        self.enabled = speculates(config, proposer)
        self.cost_model = cost_model
        self.proposer = proposer
        self.learns = proposer is not None and observes(proposer)  # observe() every step
        self.tree_shape = tree_shape
        self.policy = policy  # and the rest that goes with it (the setter below)
        self.shadows = shadows
        self.seed_report: SeedReport | None = None
        self.last_chosen_k: tuple[int, ...] = ()  # the last plan's lengths (metrics)
        self.last_plan_time = 0.0  # seconds of the last policy.plan (part of the step's time)
        self._base = StepFeatures()
        self.rested = False
        self._run = 0  # rested steps since the last plan
        self.tends = True  # whether this step is tended (REST_SEEN_EVERY)
        # steps this driver rested / planned / planned with drafts (benchmarks read them)
        self.num_rested = self.num_plans = self.num_drafting_plans = 0
        self.tally = SpecTally(config.proposers if self.enabled else ())
        self.last_goodput = 0.0  # emitted tokens / seconds of the last step

    @property
    def policy(self) -> SpecPolicy:
        return self._policy

    @policy.setter
    def policy(self, policy: SpecPolicy) -> None:
        """A policy that rests (goodput) is asked for a plan only now and then while its plans
        do not pay (control/rest.py; `rested`: this step's plan was skipped); a new policy
        starts new rests, or none where it does not rest. One rest per batch class
        (rest.batch_class): whether drafts pay depends on the batch, and a rest carried from
        16 copying requests to one held it to a plan in 16 steps where drafts paid 2.5x."""
        self._policy = policy
        rests = getattr(policy, "rests", False) and self.enabled
        self._rests: dict[int, PlanningRest] = {}
        self.rest: PlanningRest | None = self._rest_for(1) if rests else None

    @property
    def proposer_name(self) -> str | None:
        """The proposer's name when speculation is on (a request may still turn it off)."""
        return getattr(self.proposer, "name", None) if self.enabled else None

    # ---- 1. plan -------------------------------------------------------------------------
    def plan(self, running: Sequence[Request], waiting: Sequence[Request] = ()) -> SpecPlan:
        """num_draft_tokens per caught-up running request; the policy sees every decode of
        the step (a cap of 0 where it cannot draft) and the step's base features, what it
        will run: decodes, prefill chunks clipped to the token budget in order, and the
        waiting requests the scheduler will admit (while seats and budget last). While a
        resting policy's plans do not pay, most steps skip the offers and the plan (rest.py; one
        or two requests only while the long ledger says so too)."""
        if not self.enabled:
            return {}
        if self.rest is not None:
            self.rest = self._rest_for(len(running))
        few = len(running) < REST_FROM
        self.rested = self.rest is not None and self.rest.skips(few)
        self.tends = not self.rested or self._run % REST_SEEN_EVERY == 0
        self._run = self._run + 1 if self.rested else 0
        if self.rested:
            self.num_rested += 1
            self.last_plan_time, self.last_chosen_k = 0.0, ()
            self.policy.rest_step()
            return {}
        start = time.perf_counter()  # planning time: the proposer's offers, the policy's plan
        candidates = []
        for request in running:
            num_tokens, remaining = request.num_tokens, request.num_remaining_output_tokens
            max_draft_tokens = min(self._cap(request), remaining - 1)
            if self.rest is not None and not self.tree:
                max_draft_tokens = self.rest.chain_cap(max_draft_tokens, request.spec.whole)
            caught_up = request.num_computed_tokens == num_tokens - 1
            kind, offers = "", {}
            if caught_up and max_draft_tokens > 0:
                max_draft_tokens, kind, offers = self._offer(request, max_draft_tokens)
            request.spec.kind = kind
            if caught_up:  # a decode: a candidate, or (cap 0) a token every plan emits
                drafts = max(0, max_draft_tokens)
                candidates.append(
                    SpecCandidate(
                        request.request_id,
                        num_tokens,
                        drafts,
                        request.spec,
                        self._catchup_tokens(request) if self.draft_model and drafts else 0,
                        kind,
                        offers,
                        remaining,
                    )
                )
        plan = {}
        if any(c.max_draft_tokens for c in candidates):
            shapes = self._step_shapes(running, waiting)
            self._base = StepFeatures.from_shapes(shapes, self.draft_model, self.graphs)
            plan = self.policy.plan(candidates, self._base)
        self.last_plan_time = time.perf_counter() - start
        self.last_chosen_k = tuple(plan.values())
        self.num_plans += 1
        self.num_drafting_plans += bool(plan)
        if self.rest is not None:
            self.rest.planned(bool(plan))
        return plan

    def _rest_for(self, num_running: int) -> PlanningRest:
        """The rest of this batch's class (its ledger and turn), a fresh one the first time."""
        cls = batch_class(num_running)
        rest = self._rests.get(cls)
        if rest is None:
            rest = self._rests[cls] = PlanningRest()
        return rest

    def _offer(
        self, request: Request, max_draft_tokens: int
    ) -> tuple[int, str, dict[str, tuple[int, str]]]:
        """(the cap lowered to what the proposer can draft now, the kind of that proposal, and
        with proposer choice each member's offer) where it can say so cheaply before the plan
        (`offer`, an optional capability: the n-gram lookup; a ProposerSet's `offers`); a
        proposer that cannot say is planned up to the cap, kind "". With choice the cap stays
        unless every member offered nothing."""
        offers = getattr(self.proposer, "offers", None)
        if offers is not None:
            offered = offers(request.spec.memos, request.token_view(), max_draft_tokens, self.tree)
            everyone = len(offered) == len(self.config.proposers)
            if everyone and not any(n for n, _ in offered.values()):
                return 0, "", offered
            return max_draft_tokens, "", offered
        offer = getattr(self.proposer, "offer", None)
        if offer is None:
            return max_draft_tokens, "", {}
        drafts, kind = offer(request.spec.memos, request.token_view(), max_draft_tokens, self.tree)
        return drafts, kind, {}

    def _catchup_tokens(self, request: Request) -> int:
        """Tokens the draft model would feed to catch up before drafting for the request."""
        catchup = getattr(self.proposer, "catchup_tokens", None) if self.draft_model else None
        return catchup(request.spec.memos, request.num_tokens) if catchup is not None else 0

    def _cap(self, request: Request) -> int:
        """The engine's draft cap, lowered by the request's own (SamplingParams)."""
        if self.tree and request.grammar is not None:
            return 0  # grammar requests verify chains only (a draft cut needs one path)
        own = request.sampling_params.max_draft_tokens
        return self.max_draft_tokens if own is None else min(own, self.max_draft_tokens)

    def _step_shapes(
        self, running: Sequence[Request], waiting: Sequence[Request]
    ) -> list[tuple[int, int, int]]:
        budget, seats = self.token_budget, self.max_num_seqs - len(running)
        shapes = []
        for request in [*running, *waiting]:
            admitted = request.status is RequestStatus.RUNNING
            if budget <= 0 or (not admitted and seats <= 0):
                break
            chunk = min(request.num_tokens - request.num_computed_tokens, budget)
            shapes.append((request.num_computed_tokens, chunk, 0))
            budget -= chunk
            seats -= not admitted
        return shapes

    # ---- 3. propose ----------------------------------------------------------------------
    def propose(self, sched: SchedulerOutput) -> Drafts:
        if self.proposer is None:
            return Drafts()
        for request in sched.preempted:  # blocks freed: what proposers knew of them is stale
            request.spec.memos.clear()
        topk = self.proposer.target_topk
        start = time.perf_counter()
        if self.shadows is not None and self.tends:  # resting too: they may wake the rest
            self.shadows.start(self._decoding(sched))
        if self.rested and not self.draft_model:  # no drafts, no prefill to warm a draft on
            elapsed = time.perf_counter() - start if self.shadows is not None else 0.0
            return Drafts(target_topk=topk, proposer_time=elapsed)
        warmed = self._warm(sched)
        asks = [self._ask(s) for s in sched.scheduled if s.num_draft_tokens > 0 and s.needs_sample]
        if not asks and not warmed:
            return Drafts(target_topk=topk, proposer_time=time.perf_counter() - start)
        drafts = self.proposer.propose(asks) if asks else Drafts()
        chains = _cut_at_grammar(drafts.chains, sched)
        elapsed = time.perf_counter() - start
        # Prefill reads are not counted as catch-up: they ride with the target's prefill rows
        # one for one, so a fit could not tell the two apart and would price the draft's
        # catch-up at the target's prefill rate; every plan's base pays them alike anyway.
        return Drafts(
            chains,
            drafts.trees,
            proposer_time=elapsed,
            num_catchup_tokens=drafts.num_catchup_tokens,
            target_topk=topk,
        )

    def _warm(self, sched: SchedulerOutput) -> int:
        """A separate draft model reads each prefill chunk in the step the target does, so a
        request's first drafts do not wait for it to read the whole prompt (the time lands in
        time to first token, where the target's own prefill is). Only where it is the one
        proposer and the request may speculate; returns the tokens it fed."""
        warm = getattr(self.proposer, "warm", None) if self.draft_model else None
        if warm is None or self.choice or not self.enabled:
            return 0
        asks = [
            self._ask(s, end=s.start + s.num_new_tokens)
            for s in sched.scheduled
            if s.num_draft_tokens == 0
            and s.start < s.request.num_prompt_tokens
            and self._cap(s.request) > 0
        ]
        return warm(asks) if asks else 0

    def _decoding(self, sched: SchedulerOutput) -> list[tuple[Request, int, str]]:
        """(request, cap, the proposer drafting for it or "") of each request that samples
        its next token this step from its last one, where a chain could be drafted and would
        not be cut at a grammar: the requests a shadow check may start on."""
        decoding = []
        for s in sched.scheduled:
            request = s.request
            if not s.needs_sample or s.num_new_tokens - s.num_draft_tokens != 1:
                continue
            cap = min(self._cap(request), request.num_remaining_output_tokens - 1)
            if cap > 0 and request.grammar is None:
                drafting = self._proposer_of(request) if s.num_draft_tokens else ""
                decoding.append((request, cap, drafting))
        return decoding

    def _ask(self, scheduled: ScheduledRequest, end: int | None = None) -> ProposeRequest:
        """The request as the proposer sees it (`end`: its tokens up to there only)."""
        request = scheduled.request
        return ProposeRequest(
            request.request_id,
            request.all_token_ids[:end],
            scheduled.num_draft_tokens,
            self.tree,
            params=request.sampling_params,
            num_prompt_tokens=request.num_prompt_tokens,
            eos_token_ids=request.eos_token_ids,
            seed=request.seed,
            block_ids=tuple(request.block_ids),
            tree_template=self._template(scheduled.num_draft_tokens),
            proposer=self._proposer_of(request),
            memos=request.spec.memos,
        )

    def _proposer_of(self, request: Request) -> str:
        """The proposer that drafts for the request this step ("" without a proposer): with
        proposer choice the policy's pick (SpecState.proposer), else the only one."""
        return request.spec.proposer if self.choice else self.proposer_name or ""

    def _template(self, num_nodes: int) -> tuple:
        """Twice the node budget: slots a proposer cannot fill are replaced by later ones."""
        if self.tree_shape is None:
            return ()
        return tuple(self.tree_shape.template(2 * num_nodes)[0])

    # ---- 6. observe ----------------------------------------------------------------------
    def observe(self, sched: SchedulerOutput, drafts: Drafts, out: ModelOutput) -> None:
        if sched.is_empty:
            return
        seconds = out.step_time + drafts.proposer_time
        if self.proposer is None:  # nothing proposes: the step's goodput (metrics) only
            self._step_goodput(sum(len(o.token_ids) for o in out.outputs.values()), seconds)
            return
        if not (self.tends or self.learns or drafts.chains or drafts.trees):
            # a rested step off its turn: its tokens counted, nothing else
            self._step_goodput(sum(len(o.token_ids) for o in out.outputs.values()), seconds)
            return
        results, shapes, emitted = self._observe_requests(sched, drafts, out)
        step_seconds = self._step_goodput(emitted, seconds)
        if not self.enabled:  # nothing predicts step times: the cost model learns nothing
            return
        if self.rested:
            if any(r.shadow and r.num_accepted_tokens >= WAKE_ACCEPTED for r in results):
                self.rest.wake()  # a chain that would have paid: plan the next step
            if not self.tends:  # a learning proposer's rested step off its turn
                return
        elif self.rest is not None:
            accepted = sum(o.num_accepted_tokens for o in out.outputs.values())
            num_drafts, excess = self._draft_excess(shapes, seconds)
            self.rest.observed(
                accepted, emitted, self.last_plan_time, step_seconds, num_drafts, excess
            )
        features = self._features(sched, shapes, drafts)
        # Choice: model-free proposing is priced per request apart from the cost model, and
        # planning by the policy's own term (GoodputPolicy.plan_seconds), not by the model.
        model_seconds = seconds - (self.proposer.free_seconds if self.choice else 0.0)
        self.policy.observe(results, features, model_seconds)

    def _step_goodput(self, emitted: int, seconds: float) -> float:
        """The step's seconds with its plan's, and its emitted tokens per second of them."""
        step_seconds = seconds + self.last_plan_time
        self.last_goodput = emitted / step_seconds if step_seconds > 0 else 0.0
        return step_seconds

    def _observe_requests(
        self, sched: SchedulerOutput, drafts: Drafts, out: ModelOutput
    ) -> tuple[list[SpecResult], list[tuple[int, int, int]], int]:
        """Each verified request to the proposer (where it `observes`) and the tree shape;
        its outcome counted. One pass over the step's requests, which also gives the step's
        shapes (context, new tokens, drafts) for the cost model and its emitted tokens: on a
        step without drafts this pass is most of the driver's work (docs/benchmarks.md
        §5zi). Returns (results, shapes, emitted)."""
        drafted = bool(drafts.chains or drafts.trees)
        learns, checks = self.learns, self.shadows is not None and self.tends
        results, observations, shapes, emitted = [], [], [], 0
        for scheduled in sched.scheduled:
            request_id = scheduled.request_id
            new_tokens = scheduled.num_new_tokens - scheduled.num_draft_tokens
            num_drafts = drafts.num_draft_tokens(request_id) if drafted else 0
            shapes.append((scheduled.start, new_tokens, num_drafts))
            step = out.outputs.get(request_id)
            if step is None or not step.token_ids:
                continue
            emitted += len(step.token_ids)
            if learns:
                memos = scheduled.request.spec.memos
                observations.append(Observation(step, drafts.draft_ids(request_id), memos))
            if drafted:
                self._observe_tree(drafts.trees.get(request_id), step.token_ids)
            result = self._result(scheduled, step.num_draft_tokens, step.num_accepted_tokens)
            if result is not None:
                results.append(result)
            if checks and scheduled.request.spec.shadows:
                results.extend(self.shadows.check(scheduled.request))
        if observations:
            self.proposer.observe(observations)
        return results, shapes, emitted

    def _observe_tree(self, tree: DraftTree | None, token_ids: Sequence[int]) -> None:
        """A verified tree's accepted path, to the tree shape estimator."""
        if tree is not None and self.tree_shape is not None:
            self.tree_shape.observe(tree, accepted_path(tree, token_ids))

    def _draft_excess(
        self, shapes: list[tuple[int, int, int]], seconds: float
    ) -> tuple[int, float]:
        """The step's drafts and its seconds (proposing included) over the cost model's
        prediction of the same step without them (0 while the model is not fitted)."""
        num_drafts = sum(k for _, _, k in shapes)
        if not self.cost_model.fitted:
            return num_drafts, 0.0
        plain = [(start, new, 0) for start, new, _ in shapes]
        return num_drafts, seconds - self.cost_model.predict(
            StepFeatures.from_shapes(plain, False, self.graphs)
        )

    def _features(
        self, sched: SchedulerOutput, shapes: list[tuple[int, int, int]], drafts: Drafts
    ) -> StepFeatures:
        """The step's features; with proposer choice the draft model ran as many passes as
        the longest draft of the requests it drafted for, not of every request."""
        catchup = drafts.num_catchup_tokens
        if not self.choice:
            return StepFeatures.from_shapes(shapes, self.draft_model, self.graphs, catchup)
        features = StepFeatures.from_shapes(shapes, False, self.graphs, catchup)
        passes = max(
            (
                drafts.num_draft_tokens(s.request_id)
                for s in sched.scheduled
                if s.request.spec.proposer == DRAFT_PROPOSER
            ),
            default=0,
        )
        return dataclasses.replace(features, num_draft_steps=passes)

    def _result(
        self, scheduled: ScheduledRequest, num_draft_tokens: int, num_accepted: int
    ) -> SpecResult | None:
        """The request's outcome for its proposer's estimate, counted in the tally and in
        the request's own stats (overall and per proposer)."""
        request = scheduled.request
        request.spec.whole = num_draft_tokens if num_accepted == num_draft_tokens else 0
        if not num_draft_tokens and not scheduled.num_draft_tokens:
            return None
        name = self._proposer_of(request)
        if num_draft_tokens:
            self.tally.count(name, num_draft_tokens, num_accepted)
            request.spec.counts.add(num_draft_tokens, num_accepted, name)
            return SpecResult(
                request.request_id,
                num_draft_tokens,
                num_accepted,
                name,
                spec=request.spec,
                kind=request.spec.kind,
            )
        # Planned, but the proposer found nothing: speculation bought nothing this step,
        # which the estimate must see (as one rejected draft), or it would keep reserving
        # slots for a request that never gets drafts.
        return SpecResult(request.request_id, 1, 0, name, spec=request.spec, kind=request.spec.kind)

    def stats_fields(self) -> dict:
        """The EngineStats fields of speculation: the tally's counters, the last step's."""
        return dict(
            **self.tally.fields(),
            last_predicted_step_time=getattr(self.policy, "last_predicted_step_time", None),
            last_plan_time=self.last_plan_time,
            last_goodput=self.last_goodput,
            last_chosen_k=self.last_chosen_k,
        )


def _cut_at_grammar(chains: dict[str, list[int]], sched: SchedulerOutput) -> dict[str, list[int]]:
    """Each grammar request's chain up to the first token its grammar rejects: verification
    masks every draft row with the grammar's state after the drafts before it, which exists
    only for an accepted prefix (engine/structured/matcher.py)."""
    cut = dict(chains)
    for scheduled in sched.scheduled:
        grammar = scheduled.request.grammar
        chain = chains.get(scheduled.request_id)
        if grammar is not None and chain:
            cut[scheduled.request_id] = chain[: grammar.valid_prefix(chain)]
    return cut
