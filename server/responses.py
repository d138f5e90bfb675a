"""Response bodies of the OpenAI API (completions, chat completions, their stream chunks, models).

Streamed completion chunks reuse CompletionResponse (OpenAI sends `text_completion` objects in
both cases); `usage` is null on chunks except the final `include_usage` one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, Field

from engine.request import SpecCounts


class ProposerUsage(BaseModel):
    """One proposer's share of a request's speculation (the API's view of SpecCounts)."""

    draft_tokens: int  # draft tokens verified
    accepted_tokens: int  # of which accepted
    verify_steps: int  # steps that verified drafts: SpecCounts.num_drafts (one draft a step)


class SpeculationUsage(ProposerUsage):
    """Extension: the request's speculative decoding, summed over its choices, with the
    share of each proposer that drafted for it (`proposers`, by name)."""

    proposer: str
    proposers: dict[str, ProposerUsage] = {}

    @classmethod
    def of(cls, stats: Iterable[SpecCounts | None]) -> SpeculationUsage | None:
        known = [s for s in stats if s is not None]
        if not known:
            return None
        shares: dict[str, list[SpecCounts]] = {}
        for share in (p for s in known for p in s.by_proposer.values()):
            shares.setdefault(share.proposer, []).append(share)
        return cls(
            proposer=known[0].proposer,
            **_summed(known),
            proposers={name: ProposerUsage(**_summed(group)) for name, group in shares.items()},
        )


def _summed(stats: list[SpecCounts]) -> dict[str, int]:
    return dict(
        draft_tokens=sum(s.num_draft_tokens for s in stats),
        accepted_tokens=sum(s.num_accepted_tokens for s in stats),
        verify_steps=sum(s.num_drafts for s in stats),
    )


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # Only when the engine speculates (left out, not null, otherwise).
    speculation: SpeculationUsage | None = Field(default=None, exclude_if=lambda v: v is None)

    @classmethod
    def of(
        cls,
        num_prompt_tokens: int,
        num_completion_tokens: int,
        spec: Iterable[SpecCounts | None] = (),
    ) -> UsageInfo:
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_completion_tokens,
            total_tokens=num_prompt_tokens + num_completion_tokens,
            speculation=SpeculationUsage.of(spec),
        )


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ChatLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatLogprob):
    top_logprobs: list[ChatLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class FunctionCallOut(BaseModel):
    name: str
    arguments: str  # JSON text


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut


class DeltaToolCall(ToolCallOut):
    index: int  # the call's position among this choice's calls (streamed whole)


def _if_none(value: object) -> bool:
    return value is None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = ""
    tool_calls: list[ToolCallOut] | None = Field(default=None, exclude_if=_if_none)


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = Field(default=None, exclude_if=_if_none)


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "goodspeed"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
