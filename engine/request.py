"""Request: one sequence being generated, owned and mutated by the scheduler.

Token bookkeeping (the invariant every layer relies on):
    all_token_ids = prompt_token_ids + output_token_ids            (verified tokens only)
    num_computed_tokens <= num_tokens: tokens whose K/V sit in the paged cache
    while decoding, num_computed_tokens == num_tokens - 1 (the last sampled token is fed next step)
Drafts never live on the Request: a step's drafts travel in engine.outputs.Drafts, and only
verified tokens are appended.
A request with n > 1 is split by the engine into n Requests; children carry parent_request_id.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.structured.matcher import GrammarMatcher


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"  # EOS, a stop token or a stop string
    FINISHED_LENGTH = "finished_length"  # max_tokens or the context length
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    # Cached on each member: both are read for every request on every step.
    @functools.cached_property
    def finished(self) -> bool:
        return self.value.startswith("finished")

    @functools.cached_property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self)


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
}


@dataclass
class SpecCounts:
    """Verified speculation, the one counter type: drafts verified (a chain or a tree each, so
    one per verify step of a request), their tokens (tree nodes) and how many of those were
    accepted, overall and per proposer that drafted them. A request's (SpecState.counts), its
    RequestOutput's (a snapshot: DESIGN §3's per-request spec statistics) and the engine's
    totals (SpecTally.totals, behind EngineStats) are all SpecCounts."""

    proposer: str = ""  # whose drafts: the engine's proposer ("ngram,draft" when several)
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    by_proposer: dict[str, SpecCounts] = field(default_factory=dict)  # the same, per proposer

    def add(self, num_draft_tokens: int, num_accepted_tokens: int, proposer: str = "") -> None:
        """One verified draft (none without tokens), counted under `proposer` too when named."""
        if num_draft_tokens <= 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        if proposer:
            share = self.by_proposer.setdefault(proposer, SpecCounts(proposer))
            share.add(num_draft_tokens, num_accepted_tokens)

    def snapshot(self, proposer: str) -> SpecCounts:
        """A copy, named after `proposer`, that later steps do not change."""
        shares = {name: dataclasses.replace(c) for name, c in self.by_proposer.items()}
        return dataclasses.replace(self, proposer=proposer, by_proposer=shares)


@dataclass
class SpecState:
    """Speculation's record of one request (engine/speculation). It lives on the request and
    ends with it, so nothing in speculation keeps a map by request id; the core never reads it.
    The memos describe the request's KV blocks too, so they are dropped when it is preempted."""

    counts: SpecCounts = field(default_factory=SpecCounts)
    proposer: str = ""  # the proposer drafting for it this step (proposer choice)
    kind: str = ""  # the kind of its proposal this step (SpecCandidate.kind), for its result
    # Per proposer: its acceptance estimate's counts (control/acceptance.py) and the plan that
    # last ran it (control/goodput.py's exploration).
    acceptance: dict[str, list[float]] = field(default_factory=dict)
    last_run: dict[str, int] = field(default_factory=dict)
    # This step's plan: the expected acceptance of each draft it gave the request, by its
    # estimate (control/goodput.py compares them with the outcome: the estimate's calibration).
    expected: tuple[float, ...] = ()
    # Drafts of its last verified chain when every one was accepted, else 0: under a resting
    # policy a chain passes SHORT_CHAIN drafts only up to twice this (control/rest.py).
    whole: int = 0
    # Per proposer: its own state of the request (n-gram index, recycle root, draft-model KV).
    memos: dict[str, Any] = field(default_factory=dict)
    # Per model-free proposer: its last chain checked against the emitted tokens instead of
    # verified (engine/speculation/shadow.py's Shadow).
    shadows: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()  # the model's end-of-sequence ids: any of them stops
    max_total_tokens: int = 1 << 30  # prompt + output cap from the context length (set by engine)
    arrival_time: float = field(default_factory=time.monotonic)
    parent_request_id: str | None = None  # set on children 1..n-1 of an n > 1 request
    group_id: str | None = None  # n > 1: the caller's request id, shared by its n children
    index: int = 0  # n > 1: which of the n choices this is
    seed: int | None = None  # effective seed (sampling_params.seed + child index, or random)

    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (last admission)
    block_ids: list[int] = field(default_factory=list)
    window_block_ids: list[int] = field(default_factory=list)  # the window layers' pool's
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    error: str | None = None
    # The request field the error is the request's own fault in ("guided": a grammar this
    # model's vocabulary cannot continue); None: the engine's.
    error_param: str | None = None
    grammar: GrammarMatcher | None = None  # structured output: advanced by verified tokens

    # What the engine's components keep about the request lives here, so that it ends with the
    # request (one owner per request: no component keeps a map by request id).
    arrival_index: int = 0  # scheduler: first-come-first-served order
    block_hashes: list[bytes] = field(default_factory=list)  # prefix cache: its full blocks'
    num_hashed_blocks: int = 0  # block manager: leading blocks registered in the prefix cache
    spec: SpecState = field(default_factory=SpecState)  # speculation
    output: Any = None  # output processor: its OutputState (engine/output/output_processor.py)

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
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_ids_between(self, start: int, end: int) -> list[int]:
        """all_token_ids[start:end] (0 <= start <= end) without building all_token_ids: a cost
        in the slice's length, not the request's, for work done every step."""
        num_prompt = len(self.prompt_token_ids)
        if start >= num_prompt:
            return self.output_token_ids[start - num_prompt : end - num_prompt]
        if end <= num_prompt:
            return self.prompt_token_ids[start:end]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - num_prompt]

    def token_view(self) -> TokenView:
        """The verified tokens as a read-only sequence, without concatenating them: reads
        cost what they read (for work done every step that reads only a tail)."""
        return TokenView(self)

    @property
    def is_finished(self) -> bool:
        return self.status.finished

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

    def append_until_stop(self, token_ids: Iterable[int]) -> RequestStatus | None:
        """Append verified tokens in order until a stop condition, whose status is returned;
        the tokens after it are dropped (truncation)."""
        params = self.sampling_params
        output_token_ids, max_output_tokens = self.output_token_ids, self.max_output_tokens
        for token_id in token_ids:
            if len(output_token_ids) >= max_output_tokens:
                return RequestStatus.FINISHED_LENGTH
            output_token_ids.append(token_id)
            if self.grammar is not None and not self.grammar.accept(token_id):
                self._grammar_refused(token_id)  # never emit past a broken grammar
                return RequestStatus.FINISHED_ERROR
            if len(output_token_ids) >= params.min_tokens and (
                (token_id in self.eos_token_ids and not params.ignore_eos)
                or token_id in params.stop_token_ids
            ):
                return RequestStatus.FINISHED_STOPPED
        if len(output_token_ids) >= max_output_tokens:
            return RequestStatus.FINISHED_LENGTH
        return None

    def _grammar_refused(self, token_id: int) -> None:
        """The grammar refused a sampled token. The sampler's mask allows only tokens it takes,
        unless no token can continue it (it needs text the vocabulary cannot spell, where
        llguidance offers one token it then refuses): then the request asked for what this
        model cannot write; else it is a fault."""
        if not self.grammar.stuck_after(self.output_token_ids[:-1]):
            self.error = f"token {token_id} does not match the request's grammar"
            return
        self.error_param = "guided"
        self.error = (
            f"guided: no token of this model's vocabulary can continue the grammar after "
            f"{len(self.output_token_ids) - 1} output tokens (it needs text the tokenizer "
            "cannot spell)"
        )


def check_prompt(
    prompt_token_ids: Sequence[int], max_tokens: int | None, vocab_size: int, max_model_len: int
) -> None:
    """The one check of a prompt against the model: raises ValueError whose message starts
    with the offending field (`prompt` or `max_tokens`), so API layers can name it."""
    if not prompt_token_ids:
        raise ValueError("prompt must not be empty")
    bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"prompt: token ids must be integers in [0, {vocab_size}), got {bad[:5]}")
    num_prompt = len(prompt_token_ids)
    if num_prompt >= max_model_len:
        raise ValueError(
            f"prompt is {num_prompt} tokens; it must be shorter than the context length "
            f"{max_model_len}"
        )
    if max_tokens is not None and num_prompt + max_tokens > max_model_len:
        raise ValueError(
            f"max_tokens: prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) exceeds the "
            f"context length {max_model_len}; lower max_tokens to at most "
            f"{max_model_len - num_prompt}"
        )


def check_request(
    prompt_token_ids: Sequence[int], params: SamplingParams, vocab_size: int, max_model_len: int
) -> None:
    """The admission checks of a request's input, run once where it enters the engine
    (LLMEngine.add_request, or AsyncEngine.add_request on the event loop): ValueErrors that
    start with the offending field's name."""
    check_prompt(prompt_token_ids, params.max_tokens, vocab_size, max_model_len)
    check_token_ids(params, vocab_size)


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """The token ids a request names besides its prompt must be ids of this model's vocabulary;
    the ValueError starts with the field's name."""
    for name, ids in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias)):
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"{name}: token ids must be in [0, {vocab_size}), got {bad[:5]}")


class TokenView(Sequence[int]):
    """A request's prompt + output tokens as of its creation, read in place."""

    __slots__ = ("_request", "_len")

    def __init__(self, request: Request) -> None:
        self._request = request
        self._len = request.num_tokens

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index):  # int or slice, as a list's
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            return self._request.token_ids_between(start, max(start, stop))
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError("token index out of range")
        prompt = self._request.prompt_token_ids
        return (
            prompt[index]
            if index < len(prompt)
            else self._request.output_token_ids[index - len(prompt)]
        )
