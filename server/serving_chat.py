"""POST /v1/chat/completions: messages -> chat template -> one engine request with n choices.

Streaming sends, per choice, a first chunk whose delta carries the role, then content deltas,
then a chunk with the finish reason; `include_usage` adds a final chunk with empty choices.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import Response

from engine.async_engine import RequestStream
from engine.outputs import RequestOutput, SpecStats, TokenLogprobs
from server.logprobs import chat_logprobs
from server.protocol import ChatCompletionRequest
from server.responses import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatLogprobs,
    ChatResponseMessage,
    DeltaMessage,
    UsageInfo,
)
from server.serving import ServingContext, new_request_id, until_disconnected
from server.streaming import SSEResponse, raise_if_failed, sse_event, with_error_events


@dataclass
class _ChatJob:
    request_id: str
    model: str
    body: ChatCompletionRequest
    num_prompt_tokens: int
    stream: RequestStream
    created: int = field(default_factory=lambda: int(time.time()))


async def create_chat_completion(
    ctx: ServingContext, body: ChatCompletionRequest, raw: Request
) -> Response:
    request_id = new_request_id(raw, "chatcmpl")
    body.check_api_rules()
    model = ctx.check_model(body.model)
    params = body.sampling_params(ctx.engine.vocab_size)
    messages = [m.as_template_dict() for m in body.messages]
    prompt = await ctx.apply_chat_template(messages, body.add_generation_prompt is not False)
    ctx.check_prompt(prompt, params.max_tokens, "messages")
    ctx.check_request([prompt], params)
    (stream,) = await ctx.admit(request_id, [prompt], params)
    job = _ChatJob(request_id, model, body, len(prompt), stream)
    if body.stream:
        events = with_error_events(_stream(ctx, job), raw.scope)
        return SSEResponse(events, on_close=stream.close)
    try:
        result = await until_disconnected(raw, _collect(ctx, job), ctx.settings.disconnect_poll_s)
    finally:
        stream.close()
    return Response(result.model_dump_json(), media_type="application/json")


def _logprobs(
    ctx: ServingContext, job: _ChatJob, entries: list[TokenLogprobs]
) -> ChatLogprobs | None:
    if not job.body.logprobs:
        return None
    return ChatLogprobs(content=chat_logprobs(entries, ctx.texts))


async def _collect(ctx: ServingContext, job: _ChatJob) -> ChatCompletionResponse:
    n = job.body.n or 1
    texts = [""] * n
    logprobs: list[list[TokenLogprobs]] = [[] for _ in range(n)]
    finish_reasons: list[str | None] = [None] * n
    num_output = [0] * n
    spec: list[SpecStats | None] = [None] * n
    async for output in job.stream:
        raise_if_failed(output)
        spec[output.index] = output.spec
        texts[output.index] += output.new_text
        logprobs[output.index].extend(output.logprobs or ())
        num_output[output.index] = output.num_output_tokens
        if output.finished:
            finish_reasons[output.index] = output.finish_reason
    choices = [
        ChatChoice(
            index=i,
            message=ChatResponseMessage(content=texts[i]),
            logprobs=_logprobs(ctx, job, logprobs[i]),
            finish_reason=finish_reasons[i],
        )
        for i in range(n)
    ]
    return ChatCompletionResponse(
        id=job.request_id,
        created=job.created,
        model=job.model,
        choices=choices,
        usage=UsageInfo.of(job.num_prompt_tokens, sum(num_output), spec),
    )


async def _stream(ctx: ServingContext, job: _ChatJob) -> AsyncIterator[bytes]:
    n = job.body.n or 1
    for index in range(n):
        role = ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))
        yield sse_event(_chunk(job, [role]))
    num_output = [0] * n
    spec: list[SpecStats | None] = [None] * n
    async for output in job.stream:
        raise_if_failed(output)
        num_output[output.index] = output.num_output_tokens
        spec[output.index] = output.spec
        logprobs = _logprobs(ctx, job, output.logprobs or [])
        has_logprobs = logprobs is not None and bool(logprobs.content)
        if not (output.new_text or output.finished or has_logprobs):
            continue
        yield sse_event(_chunk(job, [_chunk_choice(output, logprobs)]))
    if job.body.include_usage:
        usage = UsageInfo.of(job.num_prompt_tokens, sum(num_output), spec)
        yield sse_event(_chunk(job, [], usage))


def _chunk_choice(output: RequestOutput, logprobs: ChatLogprobs | None) -> ChatChunkChoice:
    return ChatChunkChoice(
        index=output.index,
        delta=DeltaMessage(content=output.new_text),
        logprobs=logprobs,
        finish_reason=output.finish_reason if output.finished else None,
    )


def _chunk(
    job: _ChatJob, choices: list[ChatChunkChoice], usage: UsageInfo | None = None
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=job.request_id, created=job.created, model=job.model, choices=choices, usage=usage
    )
