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
from operator import ge, le

import numpy as np

from engine.speculation.control.cost_model import StepCostModel
from engine.speculation.control.step_features import StepFeatures
from kernels.graph_shapes import NO_GRAPHS, GraphShapes


@dataclass(slots=True)
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
        gains = self.gains if len(self.gains) == self.cap else self.gains[: self.cap]
        self.cumulative = list(accumulate(gains, initial=0.0))


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
    # The step's work that emits nothing this step and runs whatever the plan (prefill
    # chunks): left out of the seconds the ratio divides by, so drafts are priced at the
    # goodput of the step's decodes. Counted in, a long prefill chunk made any draft look
    # cheap beside it (docs/benchmarks.md §5l).
    sunk_seconds: float = 0.0
    # Tokens the step emits whatever the plan: the decodes that cannot draft this step. Counted
    # in, with their seconds, so drafts are priced at the goodput of every decode in the step;
    # left out, a lone candidate among four SmolLM2 decodes was priced at its own batch-1
    # goodput (a third of the step's), and one-draft chains at ~0.45 acceptance looked paying
    # where a draft row cost ~0.8 of a token's time (docs/benchmarks.md §5ze).
    other_tokens: float = 0.0
    # Try "every request at its cap" first (search._caps_if_best): the policy sets it when its
    # last plan was that, so a search that would not find it there pays nothing for trying.
    caps_first: bool = False
    # The last plan _totals summed and its totals: [key, totals], or empty.
    _last_totals: list = field(default_factory=list, compare=False, repr=False)

    @cached_property
    def options(self) -> tuple[tuple[SearchSlot, ...], ...]:
        """Each slot's options, less those another option of the same kind dominates."""
        return self._kept[0]

    @cached_property
    def draft_flags(self) -> tuple[tuple[bool, ...], ...]:
        """runs_draft of every option, aligned with options."""
        return self._kept[1]

    @cached_property
    def _kept(self) -> tuple[tuple[tuple[SearchSlot, ...], ...], tuple[tuple[bool, ...], ...]]:
        """options and draft_flags, in one pass over the slots."""
        options, flags, default = [], [], self.draft_model
        rivals: dict[tuple[bool, ...], list[tuple[int, int]]] = {}  # per kinds: _rival_pairs
        for slot in self.slots:
            kept = (slot,) if isinstance(slot, SearchSlot) else tuple(slot)
            kinds = tuple([default if o.draft is None else o.draft for o in kept])
            pairs = rivals.get(kinds)
            if pairs is None:
                pairs = rivals[kinds] = _rival_pairs(kinds)
            if pairs:
                kept, kinds = _undominated(kept, kinds, pairs)
            options.append(kept)
            flags.append(kinds)
        return tuple(options), tuple(flags)

    def runs_draft(self, slot: SearchSlot) -> bool:
        return self.draft_model if slot.draft is None else slot.draft

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
        return self._totals(ks, picks)[0]

    def evaluate(self, ks: Sequence[int], picks: Sequence[int] | None = None) -> SearchResult:
        features, emitted, cpu = self._totals(ks, picks)
        seconds = self.cost_model.predict(features) + self.extra_seconds
        seconds += cpu
        picks = tuple(picks) if picks is not None else (0,) * len(ks)
        return SearchResult(tuple(ks), seconds, emitted / seconds, picks)

    def _totals(
        self, ks: Sequence[int], picks: Sequence[int] | None
    ) -> tuple[StepFeatures, float, float]:
        """A plan's step features, expected emitted tokens and proposing CPU seconds, summed
        in slot order in one pass (the search evaluates a plan per Dinkelbach round)."""
        picks = picks if picks is not None else (0,) * len(ks)
        key = (tuple(ks), tuple(picks))
        last = self._last_totals
        if last and last[0] == key:  # a round's marginal costs, then its plan evaluated
            return last[1]
        emitted, cpu = self.other_tokens, 0.0
        drafts = spec = passes = longest = 0
        for options, flags, p, k in zip(self.options, self.draft_flags, picks, ks):
            slot = options[p]
            emitted += 1.0 + slot.cumulative[k]
            if k > 0:
                cpu += slot.propose_seconds
                drafts, spec, longest = drafts + k, spec + 1, max(longest, k)
                if flags[p]:
                    passes = max(passes, slot.depths[k - 1])
        features = self.base.with_drafts(drafts, spec, passes, self.graphs, longest)
        last[:] = [key, (features, emitted, cpu)]
        return features, emitted, cpu

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


def _rival_pairs(kinds: tuple[bool, ...]) -> list[tuple[int, int]]:
    """(option, rival) index pairs of the same kind (draft model or not): the comparisons
    _undominated makes, the same for every slot whose options have these kinds."""
    indices = range(len(kinds))
    return [(i, j) for i in indices for j in indices if j != i and kinds[j] == kinds[i]]


def _undominated(
    options: tuple[SearchSlot, ...], kinds: tuple[bool, ...], pairs: list[tuple[int, int]]
) -> tuple[tuple[SearchSlot, ...], tuple[bool, ...]]:
    """Drop an option when another of the same kind (one of `pairs`) gains at least as much at
    every k, reaches as far and costs no more CPU: any plan using the dropped one does at
    least as well with the other (same features, no fewer tokens). Typically the model-free
    proposers reduce to the best of them. The kept options and their kinds."""
    dropped = set()
    for i, j in pairs:
        if i not in dropped and _dominates(options[j], options[i], kinds[i], j < i):
            dropped.add(i)
    if not dropped:
        return options, kinds
    kept = [i for i in range(len(options)) if i not in dropped]
    return tuple([options[i] for i in kept]), tuple([kinds[i] for i in kept])


def _dominates(p: SearchSlot, o: SearchSlot, draft: bool, earlier: bool) -> bool:
    """p is as good as o for every k (fewer or equal passes too, for draft options); on an
    exact tie the earlier option stays."""
    if p.floor != o.floor or p.cap < o.cap or p.propose_seconds > o.propose_seconds:
        return False
    gains, rival = p.cumulative[1 : o.cap + 1], o.cumulative[1 : o.cap + 1]
    if not all(map(ge, gains, rival)):
        return False
    if draft and not all(map(le, p.depths[: o.cap], o.depths[: o.cap])):
        return False
    tie = p.cap == o.cap and p.propose_seconds == o.propose_seconds
    return earlier or not (tie and gains == rival)


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
    _within: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(
        cls, options: Sequence[Sequence[SearchSlot]], flags: Sequence[Sequence[bool]]
    ) -> OptionTable:
        n, m = len(options), max(len(o) for o in options)
        missing = SearchSlot((), (), 0, floor=1)  # pads a slot's options to m: never valid
        slots = [slot for o in options for slot in (*o, *(missing,) * (m - len(o)))]
        draft = [runs for f in flags for runs in (*f, *(False,) * (m - len(f)))]
        caps = [s.cap for s in slots]
        width = 1 + max(caps)
        cumulative = np.array(
            [
                s.cumulative if s.cap == width - 1 else _padded(s.cumulative, width, -np.inf)
                for s in slots
            ]
        ).reshape(n, m, width)
        cumulative[..., 0][np.array([s is missing for s in slots]).reshape(n, m)] = -np.inf
        floors = np.array([s.floor for s in slots], dtype=np.int64).reshape(n, m)
        caps = np.array(caps, dtype=np.int64).reshape(n, m)
        seconds = np.array([s.propose_seconds for s in slots], dtype=float).reshape(n, m)
        draft = np.array(draft, dtype=bool).reshape(n, m)
        k = np.arange(width)
        if all(s is missing or _one_pass_each(s) for s in slots):
            depths = np.where(k <= caps[..., None], k, 0)  # one pass per draft (chains)
        else:
            depths = np.array(
                [_padded((0, *s.depths[: s.cap]), width, 0) for s in slots], dtype=np.int64
            ).reshape(n, m, width)
        return cls(cumulative, depths, floors, caps, seconds, draft)

    @cached_property
    def ks(self) -> tuple[np.ndarray, np.ndarray]:
        """The table's k axis, 0..max_cap, and whether each k drafts (k > 0)."""
        k = np.arange(self.cumulative.shape[2])
        return k, k > 0

    def within(self, cap: int) -> np.ndarray:
        """cumulative where k is in [floor, cap] (draft options also k <= the pass `cap`),
        -inf elsewhere: each Dinkelbach round's choices under that pass cap."""
        masked = self._within.get(cap)
        if masked is None:
            k = np.arange(self.cumulative.shape[2])
            limit = np.where(self.draft, np.minimum(self.caps, cap), self.caps)
            valid = (k >= self.floors[..., None]) & (k <= limit[..., None])
            masked = self._within[cap] = np.where(valid, self.cumulative, -np.inf)
        return masked


def _one_pass_each(slot: SearchSlot) -> bool:
    """Draft k of the slot needs k passes (a chain's depths: range(1, cap + 1))."""
    depths = slot.depths  # range(1, cap + 1), or one going further, as the policy makes them
    return (
        type(depths) is range and depths.start == 1 and depths.step == 1 and depths.stop > slot.cap
    )


def _padded(values: Sequence, width: int, fill) -> list:
    """values, then fill up to width."""
    return [*values, *(fill,) * (width - len(values))]
