"""The data contracts between engine layers (DESIGN.md §3), defined in one place.

Flow of one step:  SpecPlan -> Scheduler.schedule -> SchedulerOutput -> Proposer.propose ->
Drafts -> ModelRunner.execute -> ModelOutput -> Scheduler.update -> RequestOutput (to callers).
Everything here is host data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from engine.request import Request, SpecCounts

# request_id -> number of draft tokens (chains) or tree node budget (trees) for this step.
SpecPlan = dict[str, int]


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step.

    The step computes K/V for all_token_ids[start : start + num_new_tokens - num_draft_tokens]
    followed by num_draft_tokens draft tokens (filled in by the proposer). When the chunk reaches
    the request's last known token (`needs_sample`), the runner samples or verifies.
    """

    request: Request
    num_new_tokens: int  # prefill chunk, or 1 + reserved draft slots
    num_draft_tokens: int = (
        0  # draft tokens reserved for this step (<= plan[k]); 0 while prefilling
    )
    start: int = 0  # == request.num_computed_tokens when scheduled
    # The chunk reaches the request's last known token, as scheduled (read every step by the
    # input packing, the proposer and the update; set once here).
    needs_sample: bool = field(init=False)

    def __post_init__(self) -> None:
        end = self.start + self.num_new_tokens - self.num_draft_tokens
        object.__setattr__(self, "needs_sample", end >= self.request.num_tokens)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def check(self, step_output: RequestStepOutput | None) -> str | None:
        """The error that finishes this request given its step output, if any."""
        if step_output is None:
            return None
        if step_output.error is not None:
            return step_output.error
        num_tokens = len(step_output.token_ids)
        if num_tokens > self.num_draft_tokens + 1 or (num_tokens and not self.needs_sample):
            return (
                f"model runner returned {num_tokens} tokens for a step with "
                f"{self.num_draft_tokens} draft slots (needs_sample={self.needs_sample})"
            )
        return None


class BlockCopy(NamedTuple):
    """Copy-on-write of one block, run before the step's forward: in the full-attention
    layers' pool, or (window) in the sliding-window layers' own pool."""

    src: int
    dst: int
    window: bool = False


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledRequest, ...]
    preempted: tuple[Request, ...] = ()  # blocks freed this step: recomputed later
    block_copies: tuple[BlockCopy, ...] = ()
    num_batched_tokens: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def preempted_ids(self) -> tuple[str, ...]:
        return tuple(request.request_id for request in self.preempted)


@dataclass(frozen=True)
class DraftTree:
    """Drafts as a tree over the request's last verified token (the root): nodes in
    topological order (parent_ids[i] < i; None: a child of the root), rows ordered [root,
    node 0, node 1, ...]. Its geometry is engine/sample/tree.py."""

    token_ids: tuple[int, ...]
    parent_ids: tuple[int | None, ...]
    # Per node, the rank of its token among the proposer's candidates after its parent (trees
    # filled from a template, which may skip a rank); None: a node's index among its siblings
    # is its rank. Tree-shape learning credits acceptance to these ranks.
    ranks: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.parent_ids):
            raise ValueError("token_ids and parent_ids must have the same length")
        if self.ranks is not None and len(self.ranks) != len(self.token_ids):
            raise ValueError("ranks, when given, must have one entry per node")
        for i, parent in enumerate(self.parent_ids):
            if parent is not None and not 0 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must precede it")

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    def depths(self) -> list[int]:
        """Depth of each node; children of the root have depth 1."""
        depths: list[int] = []
        for parent in self.parent_ids:
            depths.append(1 if parent is None else depths[parent] + 1)
        return depths


@dataclass(frozen=True)
class Drafts:
    """Per request: a chain of draft token ids, or a DraftTree. Missing id = no drafts."""

    chains: dict[str, list[int]] = field(default_factory=dict)
    trees: dict[str, DraftTree] = field(default_factory=dict)
    proposer_time: float = 0.0  # seconds spent proposing (cost-model feature)
    # Verified tokens a draft model fed to catch up before drafting (StepFeatures term).
    num_catchup_tokens: int = 0
    # How many of the target's top token ids the proposer wants per emitted token (its
    # Proposer.target_topk; RequestStepOutput.target_topk_ids). 0: none.
    target_topk: int = 0

    def draft_ids(self, request_id: str) -> tuple[int, ...]:
        """The request's draft tokens in row order (tree nodes in node order)."""
        if request_id in self.trees:
            return self.trees[request_id].token_ids
        return tuple(self.chains.get(request_id, ()))

    def num_draft_tokens(self, request_id: str) -> int:
        if request_id in self.trees:
            return self.trees[request_id].num_nodes
        return len(self.chains.get(request_id, ()))


@dataclass(frozen=True)
class TokenLogprobs:
    """Logprobs of one position: the chosen token's and the top-N alternatives'."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token_id, logprob), best first


@dataclass(frozen=True)
class RequestStepOutput:
    request_id: str
    token_ids: tuple[int, ...]  # accepted drafts + the bonus/correction token; empty mid-prefill
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    logprobs: tuple[TokenLogprobs, ...] = ()  # one per token_ids entry when asked
    prompt_logprobs: tuple[TokenLogprobs | None, ...] = ()  # this chunk's prompt positions
    error: str | None = None  # set when this request's processing failed (others continue)
    # Per emitted token, the target's top ids at the row that produced it, when the step's
    # Drafts.target_topk asked for them (Token Recycling).
    target_topk_ids: tuple[tuple[int, ...], ...] = ()
    # The same for every draft token's row (chain tokens or tree nodes, in row order).
    draft_topk_ids: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class ModelOutput:
    outputs: dict[str, RequestStepOutput]
    step_time: float = 0.0  # seconds, forward + sampling + verification (host-synced)


@dataclass
class RequestOutput:
    """What the engine hands to callers after each step (and, complete, from LLM.generate)."""

    request_id: str
    prompt_token_ids: list[int]
    new_token_ids: list[int]  # since the previous RequestOutput of this request
    output_token_ids: list[int]  # all so far
    new_text: str = ""  # text delta; held back while it could start a stop string
    text: str = ""  # all text so far (after stop-string truncation)
    finished: bool = False
    finish_reason: str | None = None  # stop | length | abort | error
    stop_reason: str | int | None = None  # the stop string or stop token that ended it
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[TokenLogprobs] | None = None  # new positions only
    prompt_logprobs: list[TokenLogprobs | None] | None = None  # complete, first entry None
    error: str | None = None
    # The request field its error blames (Request.error_param: the request asked for what the
    # model cannot do); None: the engine failed it.
    error_param: str | None = None
    index: int = 0  # choice index for n > 1
    group_id: str | None = None  # the user's request id for n > 1 (children share it)
    metrics: dict[str, float] = field(default_factory=dict)  # arrival, first token, finish times
    spec: SpecCounts | None = None  # this request's, so far; None when the engine has no proposer


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of engine state and cumulative counters, taken after each step (for metrics)."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    num_steps_total: int = 0
    prompt_tokens_total: int = 0  # prompt tokens computed (prefix-cache hits excluded)
    generation_tokens_total: int = 0  # output tokens emitted
    num_preemptions_total: int = 0
    prefix_cache_queries_total: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits_total: int = 0  # of which found cached
    spec_num_drafts_total: int = 0
    spec_num_draft_tokens_total: int = 0
    spec_num_accepted_tokens_total: int = 0
    spec_accepted_per_position_total: tuple[int, ...] = ()
    # (proposer, drafts, draft tokens, accepted tokens) per proposer, cumulative
    spec_proposer_totals: tuple[tuple[str, int, int, int], ...] = ()
    last_step_time: float = 0.0  # seconds, measured
    last_predicted_step_time: float | None = None  # seconds, cost model's prediction
    last_plan_time: float = 0.0  # seconds the speculation policy spent planning the last step
    last_goodput: float = 0.0  # emitted tokens / step time of the last step
    last_chosen_k: tuple[int, ...] = ()  # speculation lengths chosen in the last step

    @property
    def kv_cache_usage(self) -> float:
        if self.num_total_blocks == 0:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_total_blocks
