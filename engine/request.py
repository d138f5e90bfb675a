"""Request: one sequence being generated, owned and mutated by the scheduler.

Token bookkeeping (the invariant every layer relies on):
    all_token_ids = prompt_token_ids + output_token_ids            (verified tokens only)
    num_computed_tokens <= num_tokens: tokens whose K/V sit in the paged cache
    while decoding, num_computed_tokens == num_tokens - 1 (the last sampled token is fed next step)
    spec_token_ids: drafts proposed for this step; num_tokens_with_spec counts them too.
A request with n > 1 is split by the engine into n Requests; children carry parent_request_id.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"  # EOS, a stop token or a stop string
    FINISHED_LENGTH = "finished_length"  # max_tokens or the context length
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        return self.value.startswith("finished")

    @property
    def finish_reason(self) -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
            RequestStatus.FINISHED_ERROR: "error",
        }.get(self)


@dataclass
class SpecStats:
    """Per-request speculation counters (also summed engine-wide)."""

    num_drafts: int = 0  # steps in which this request verified at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        if num_draft_tokens == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        while len(self.accepted_per_position) < num_accepted_tokens:
            self.accepted_per_position.append(0)
        for position in range(num_accepted_tokens):
            self.accepted_per_position[position] += 1


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None = None
    max_total_tokens: int = 1 << 30  # prompt + output cap from the context length (set by engine)
    arrival_time: float = field(default_factory=time.monotonic)
    parent_request_id: str | None = None  # set on children 1..n-1 of an n > 1 request
    seed: int | None = None  # effective seed (sampling_params.seed + child index, or random)

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (last admission)
    block_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    spec_token_ids: list[int] = field(default_factory=list)
    spec_stats: SpecStats = field(default_factory=SpecStats)
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    error: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.finished

    @property
    def is_prefill(self) -> bool:
        """True while tokens other than the last sampled one still need their K/V computed."""
        return self.num_computed_tokens < self.num_tokens - 1

    @property
    def max_output_tokens(self) -> int:
        """How many output tokens this request may still reach in total."""
        cap = self.max_total_tokens - self.num_prompt_tokens
        if self.sampling_params.max_tokens is not None:
            cap = min(cap, self.sampling_params.max_tokens)
        return cap

    @property
    def num_remaining_output_tokens(self) -> int:
        return max(0, self.max_output_tokens - self.num_output_tokens)
