"""The goodput search's problem (search.py solves it): per candidate request, one option per
proposer (a SearchSlot: the gains of drafts 1..cap, the draft-model passes each needs, its
CPU cost), the step's base features and the cost model; a plan is a k and an option per slot.
Options another of the same kind dominates are dropped up front, so choosing among model-free
proposers costs the search about one option.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate

import numpy as np

from engine.speculation.control.cost_model import StepCostModel
from engine.speculation.control.step_features import StepFeatures
from kernels.graph_shapes import NO_GRAPHS, GraphShapes


@dataclass
class SearchSlot:
    """One candidate (or one proposer option of a candidate): marginal gains of drafts
    1..cap, the draft-model passes each needs."""

    gains: Sequence[float]
    depths: Sequence[int]
    cap: int
    floor: int = 0  # a forced minimum (exploration of an idle request)
    proposer: str = ""  # the option's proposer (proposer choice)
    draft: bool | None = None  # runs draft-model passes; None: the problem's draft_model
    propose_seconds: float = 0.0  # CPU seconds of proposing for this request, when k > 0
    cumulative: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.cumulative = list(accumulate(self.gains[: self.cap], initial=0.0))


@dataclass(frozen=True)
class SearchResult:
    ks: tuple[int, ...]
    predicted_seconds: float
    goodput: float  # expected emitted tokens per second
    picks: tuple[int, ...] = ()  # the option chosen per slot (index into its options)


@dataclass(frozen=True)
class SearchProblem:
    slots: Sequence[SearchSlot | Sequence[SearchSlot]]  # one option, or one per proposer
    base: StepFeatures
    cost_model: StepCostModel
    draft_model: bool = False
    graphs: GraphShapes = NO_GRAPHS
    token_budget: int | None = None
    overhead_seconds: float = 0.0  # paid by every plan: the planning itself
    # The step's work that emits nothing this step and runs whatever the plan (prefill chunks,
    # decodes that cannot speculate): left out of the seconds the ratio divides by, so drafts
    # are priced at the goodput of the speculating requests' own decoding. Counted in, a long
    # prefill chunk made any draft look cheap beside it (docs/benchmarks.md §5l).
    sunk_seconds: float = 0.0
    # Try "every request at its cap" first (search._caps_if_best): the policy sets it when its
    # last plan was that, so a search that would not find it there pays nothing for trying.
    caps_first: bool = False

    @cached_property
    def options(self) -> tuple[tuple[SearchSlot, ...], ...]:
        """Each slot's options, less those another option of the same kind dominates."""
        return tuple(
            (s,) if isinstance(s, SearchSlot) else self._undominated(tuple(s)) for s in self.slots
        )

    def _undominated(self, options: tuple[SearchSlot, ...]) -> tuple[SearchSlot, ...]:
        """Drop an option when another of the same kind (draft model or not) gains at least as
        much at every k, reaches as far and costs no more CPU: any plan using the dropped one
        does at least as well with the other (same features, no fewer tokens). Typically the
        model-free proposers reduce to the best of them."""
        kinds = [self.runs_draft(o) for o in options]
        if len(set(kinds)) == len(kinds):  # each option alone of its kind: none to compare
            return options
        kept = []
        for i, option in enumerate(options):
            rivals = ((j, p) for j, p in enumerate(options) if j != i and kinds[j] == kinds[i])
            if not any(_dominates(p, option, kinds[i], j < i) for j, p in rivals):
                kept.append(option)
        return tuple(kept)

    def runs_draft(self, slot: SearchSlot) -> bool:
        return self.draft_model if slot.draft is None else slot.draft

    @cached_property
    def draft_flags(self) -> tuple[tuple[bool, ...], ...]:
        """runs_draft of every option, aligned with options."""
        return tuple(tuple(map(self.runs_draft, options)) for options in self.options)

    @cached_property
    def any_draft(self) -> bool:
        return any(any(flags) for flags in self.draft_flags)

    @cached_property
    def pads(self) -> bool:
        """Verification steps replay graphs padded to the longest chain (and there is no
        draft model): a plan's rows follow its longest chain (padded_plans.py)."""
        return self.graphs.enabled and self.graphs.max_query_len > 1 and not self.any_draft

    @cached_property
    def any_free(self) -> bool:
        """Some option runs no draft-model pass (only asked when some option does)."""
        return not all(all(flags) for flags in self.draft_flags)

    @cached_property
    def table(self) -> OptionTable:
        """The options as arrays, for choosing every slot's (option, k) at once."""
        return OptionTable.of(self.options, self.draft_flags)

    def chosen(self, picks: Sequence[int] | None) -> list[SearchSlot]:
        if picks is None:
            return [options[0] for options in self.options]
        return [options[p] for options, p in zip(self.options, picks)]

    def features(self, ks: Sequence[int], picks: Sequence[int] | None = None) -> StepFeatures:
        picks = picks if picks is not None else (0,) * len(ks)
        chosen = zip(self.options, self.draft_flags, picks, ks)
        steps = max(
            (options[p].depths[k - 1] for options, flags, p, k in chosen if k > 0 and flags[p]),
            default=0,
        )
        spec = sum(1 for k in ks if k > 0)
        return self.base.with_drafts(sum(ks), spec, steps, self.graphs, max(ks, default=0))

    def evaluate(self, ks: Sequence[int], picks: Sequence[int] | None = None) -> SearchResult:
        slots = self.chosen(picks)
        emitted = sum(1.0 + s.cumulative[k] for s, k in zip(slots, ks))
        seconds = self.cost_model.predict(self.features(ks, picks)) + self.extra_seconds
        seconds += sum(s.propose_seconds for s, k in zip(slots, ks) if k > 0)
        picks = tuple(picks) if picks is not None else (0,) * len(slots)
        return SearchResult(tuple(ks), seconds, emitted / seconds, picks)

    @property
    def extra_seconds(self) -> float:
        """What every plan's predicted step time is corrected by: planning, less sunk work."""
        return self.overhead_seconds - self.sunk_seconds

    def seconds_with(self, drafts, spec, passes=0) -> np.ndarray:
        """The cost model's seconds for the base plus d drafts on s speculating requests (and
        p draft passes), for arrays of (d, s, p): the cost model's vectorised prediction where
        it has one, else one prediction each."""
        vectorised = getattr(self.cost_model, "predict_drafts", None)
        if vectorised is not None:
            return vectorised(self.base, drafts, spec, passes, self.graphs)
        drafts, spec, passes = np.broadcast_arrays(drafts, spec, passes)
        with_drafts, graphs = self.base.with_drafts, self.graphs
        return np.array(
            [
                self.cost_model.predict(with_drafts(int(d), int(s), int(p), graphs))
                for d, s, p in zip(drafts.ravel(), spec.ravel(), passes.ravel())
            ]
        ).reshape(drafts.shape)

    def fits(self, ks: Sequence[int]) -> bool:
        budget = self.token_budget
        return budget is None or self.base.num_batched_tokens + sum(ks) <= budget


def _dominates(p: SearchSlot, o: SearchSlot, draft: bool, earlier: bool) -> bool:
    """p is as good as o for every k (fewer or equal passes too, for draft options); on an
    exact tie the earlier option stays."""
    if p.floor != o.floor or p.cap < o.cap or p.propose_seconds > o.propose_seconds:
        return False
    ks = range(1, o.cap + 1)
    if any(p.cumulative[k] < o.cumulative[k] for k in ks):
        return False
    if draft and any(p.depths[k - 1] > o.depths[k - 1] for k in ks):
        return False
    tie = p.cap == o.cap and p.propose_seconds == o.propose_seconds
    return earlier or not (tie and all(p.cumulative[k] == o.cumulative[k] for k in ks))


@dataclass(frozen=True)
class OptionTable:
    """Every slot's options padded to [slots, options, k]: cumulative[i, j, k] is option j's
    E(k) - 1 (-inf past its cap or a missing option) and depths[i, j, k] the draft-model
    passes of its first k drafts, with its floor, cap, CPU seconds and whether it runs the
    draft model. Missing options have floor 1 > cap 0: never valid."""

    cumulative: np.ndarray  # [num_slots, max_options, max_cap + 1] float64
    depths: np.ndarray  # [num_slots, max_options, max_cap + 1] int
    floors: np.ndarray  # [num_slots, max_options] int
    caps: np.ndarray  # [num_slots, max_options] int
    seconds: np.ndarray  # [num_slots, max_options] float64: propose_seconds
    draft: np.ndarray  # [num_slots, max_options] bool

    @classmethod
    def of(
        cls, options: Sequence[Sequence[SearchSlot]], flags: Sequence[Sequence[bool]]
    ) -> OptionTable:
        n, m = len(options), max(len(o) for o in options)
        width = 1 + max(s.cap for o in options for s in o)
        missing = SearchSlot((), (), 0, floor=1)  # pads a slot's options to m: never valid
        padded = [(*o, *(missing,) * (m - len(o))) for o in options]
        slots = [slot for o in padded for slot in o]
        draft = [runs for f in flags for runs in (*f, *(False,) * (m - len(f)))]
        cumulative = np.array(
            [_padded(() if s is missing else s.cumulative, width, -np.inf) for s in slots]
        ).reshape(n, m, width)
        depths = np.array(
            [_padded((0, *s.depths[: s.cap]), width, 0) for s in slots], dtype=np.int64
        ).reshape(n, m, width)
        floors = np.array([s.floor for s in slots], dtype=np.int64).reshape(n, m)
        caps = np.array([s.cap for s in slots], dtype=np.int64).reshape(n, m)
        seconds = np.array([s.propose_seconds for s in slots], dtype=float).reshape(n, m)
        draft = np.array(draft, dtype=bool).reshape(n, m)
        return cls(cumulative, depths, floors, caps, seconds, draft)


def _padded(values: Sequence, width: int, fill) -> list:
    """values, then fill up to width."""
    return [*values, *(fill,) * (width - len(values))]
