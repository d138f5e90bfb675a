"""Speculation-length policies: how many draft tokens (or tree nodes) each request gets this step.

The engine calls `plan` before scheduling, with the running requests that have caught up
(decoding) and could speculate, and `observe` after verification with what was accepted and
how long the step took. A request missing from the plan (or planned 0) does not speculate;
an empty plan means the engine runs no proposer at all this step. What a policy learns about a
request lives on the request (SpecCandidate.spec, SpecResult.spec: its SpecState), so a policy
has nothing to forget when a request finishes.

Policies: `off`, `fixed:K` (here) and `goodput` (engine/speculation/control/goodput.py);
engine/speculation/build.py parses the `--spec-policy` string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from engine.outputs import SpecPlan
from engine.request import SpecState
from engine.speculation.control.step_features import StepFeatures


@dataclass(frozen=True)
class SpecCandidate:
    """One running, caught-up request: it decodes this step, and may draft up to
    max_draft_tokens (0: it cannot; a policy still counts the token it emits)."""

    request_id: str
    context_len: int  # tokens already in the KV cache
    max_draft_tokens: int  # cap from the remaining output tokens, the context length and the config
    spec: SpecState  # the request's speculation record; a policy choosing proposers writes it
    # Verified tokens a separate draft model must feed before drafting for this request (all
    # since it last ran): a draft option pays them (StepFeatures.num_catchup_tokens).
    num_catchup_tokens: int = 0
    # The kind of this step's proposal, where the proposer says it before the plan (n-gram:
    # "n<matched order>"): acceptance is estimated per kind ("": one estimate).
    kind: str = ""
    # Proposer choice: per proposer that says it before the plan, (drafts it could give, their
    # kind); a proposer not listed may draft up to max_draft_tokens.
    offers: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    # Output tokens the request may still emit (0: unknown): the steps over which a draft
    # model's catch-up pays back.
    num_remaining_tokens: int = 0


@dataclass(frozen=True)
class SpecResult:
    """One request's verification outcome."""

    request_id: str
    num_draft_tokens: int  # drafts verified (tree: nodes)
    num_accepted_tokens: int  # drafts accepted (tree: length of the accepted path)
    proposer: str = ""  # the proposer that drafted them (proposer choice; "" = the only one)
    spec: SpecState = field(kw_only=True)  # the request's speculation record
    kind: str = field(default="", kw_only=True)  # the proposal's kind (SpecCandidate.kind)
    # Not verified: a chain checked against the emitted tokens (engine/speculation/shadow.py),
    # for the proposer's estimate only (no plan acted on it, so nothing to calibrate).
    shadow: bool = field(default=False, kw_only=True)


class SpecPolicy:
    """The policy interface, with no-op defaults: never speculate, learn nothing (`off`)."""

    # For metrics: the cost model's step time for the last plan (None without a model).
    last_predicted_step_time: float | None = None
    # Whether the driver may plan only now and then while this policy's plans do not pay for
    # their planning (control/rest.py): a policy that prices drafts finds the same nothing
    # step after step, where fixed:k drafts whenever a proposer can.
    rests: bool = False

    def plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        return {}

    def observe(
        self, results: Sequence[SpecResult], features: StepFeatures, step_seconds: float
    ) -> None:
        return None

    def rest_step(self) -> None:
        """The driver rested this step: no plan was asked for (control/rest.py)."""
        return None


class OffPolicy(SpecPolicy):
    """Never speculate."""


class FixedPolicy(SpecPolicy):
    """The same number of draft tokens for every candidate (capped by its max_draft_tokens):
    classic speculation (`fixed:K`)."""

    def __init__(self, num_draft_tokens: int) -> None:
        if num_draft_tokens < 0:
            raise ValueError(f"fixed speculation length must be >= 0, got {num_draft_tokens}")
        self.num_draft_tokens = num_draft_tokens

    def plan(self, candidates: Sequence[SpecCandidate], base: StepFeatures) -> SpecPlan:
        plan = {c.request_id: min(self.num_draft_tokens, c.max_draft_tokens) for c in candidates}
        return {request_id: n for request_id, n in plan.items() if n > 0}
