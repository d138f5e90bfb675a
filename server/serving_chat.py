"""POST /v1/chat/completions: messages -> chat template -> one engine request with n choices.

Streaming sends, per choice, a first chunk whose delta carries the role, then content deltas,
then a chunk with the finish reason; `include_usage` adds a final chunk with empty choices.
With tools (server/tools.py), `<tool_call>` blocks in the output become `tool_calls`
(server/tool_parser.py; streamed one whole call per delta) and the finish reason `tool_calls`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

from engine.front.async_engine import RequestStream
from engine.outputs import RequestOutput, TokenLogprobs
from engine.request import SpecCounts
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
    DeltaToolCall,
    FunctionCallOut,
    ToolCallOut,
    UsageInfo,
)
from server.serving import Admitted, Prepared, Reply, ServingContext
from server.streaming import ChunkTemplate, raise_if_failed, sse_event
from server.tool_formats import WholeReplyStream, call_stream, parse_calls
from server.tool_parser import ParsedCall, ToolCallStream
from server.tools import ToolSetup, tool_setup


@dataclass
class _ChatJob:
    request_id: str
    model: str
    body: ChatCompletionRequest
    num_prompt_tokens: int
    stream: RequestStream
    tools: ToolSetup
    created: int = field(default_factory=lambda: int(time.time()))


class ChatRoute:
    """POST /v1/chat/completions in serving.serve: messages rendered by the chat template into
    one prompt (n choices of it), tool calls parsed from the reply."""

    id_prefix = "chatcmpl"
    prompt_field = "messages"

    async def prepare(self, ctx: ServingContext, body: ChatCompletionRequest) -> Prepared:
        tools = tool_setup(body.tools, body.tool_choice, body.parallel_tool_calls, ctx.tool_format)
        params = body.sampling_params(ctx.engine.vocab_size, tools)
        messages = [m.as_template_dict() for m in body.messages]
        add_generation_prompt = body.add_generation_prompt is not False
        prompt = await ctx.apply_chat_template(
            messages, add_generation_prompt, tools.template_tools
        )
        return Prepared([prompt], params, tools)

    async def reply(
        self,
        ctx: ServingContext,
        body: ChatCompletionRequest,
        prepared: Prepared,
        admitted: Admitted,
    ) -> Reply:
        (stream,) = admitted.streams
        num_prompt_tokens = len(prepared.prompts[0])
        job = _ChatJob(
            admitted.request_id, admitted.model, body, num_prompt_tokens, stream, prepared.state
        )
        return Reply(partial(_stream, ctx, job), partial(_collect, ctx, job), stream.close)


CHAT = ChatRoute()


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
    spec: list[SpecCounts | None] = [None] * n
    async for output in job.stream:
        raise_if_failed(output, job.body.guided_field)
        spec[output.index] = output.spec
        texts[output.index] += output.new_text
        logprobs[output.index].extend(output.logprobs or ())
        num_output[output.index] = output.num_output_tokens
        if output.finished:
            finish_reasons[output.index] = output.finish_reason
    choices = []
    for i in range(n):
        message, finish_reason = _message(texts[i], finish_reasons[i], job.tools)
        choices.append(
            ChatChoice(
                index=i,
                message=message,
                logprobs=_logprobs(ctx, job, logprobs[i]),
                finish_reason=finish_reason,
            )
        )
    return ChatCompletionResponse(
        id=job.request_id,
        created=job.created,
        model=job.model,
        choices=choices,
        usage=UsageInfo.of(job.num_prompt_tokens, sum(num_output), spec),
    )


def _message(
    text: str, finish_reason: str | None, tools: ToolSetup
) -> tuple[ChatResponseMessage, str | None]:
    calls = []
    if tools.parse:
        content, calls = parse_calls(text, tools.format)
    if not calls:
        return ChatResponseMessage(content=text), finish_reason
    tool_calls = [_tool_call(call) for call in calls]
    finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
    return ChatResponseMessage(content=content, tool_calls=tool_calls), finish_reason


def _tool_call(call: ParsedCall, index: int | None = None) -> ToolCallOut:
    function = FunctionCallOut(name=call.name, arguments=call.arguments)
    if index is None:
        return ToolCallOut(id=call.id, function=function)
    return DeltaToolCall(index=index, id=call.id, function=function)


async def _stream(ctx: ServingContext, job: _ChatJob) -> AsyncIterator[bytes]:
    n = job.body.n or 1
    for index in range(n):
        role = ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content=""))
        yield sse_event(_chunk(job, [role]))
    num_output = [0] * n
    spec: list[SpecCounts | None] = [None] * n
    parsers = [call_stream(job.tools.format) if job.tools.parse else None for _ in range(n)]
    plain = not job.tools.parse and not job.body.logprobs  # text deltas only: pre-encoded
    template = ChunkTemplate(_chunk(job, []))
    async for output in job.stream:
        raise_if_failed(output, job.body.guided_field)
        num_output[output.index] = output.num_output_tokens
        spec[output.index] = output.spec
        if plain:
            if output.new_text or output.finished:
                reason = output.finish_reason if output.finished else None
                yield template.chat(output.index, output.new_text, reason)
            continue
        logprobs = _logprobs(ctx, job, output.logprobs or [])
        has_logprobs = logprobs is not None and bool(logprobs.content)
        delta = _delta(output, parsers[output.index])
        if not (delta.content or delta.tool_calls or output.finished or has_logprobs):
            continue
        parser = parsers[output.index]
        called = parser is not None and parser.num_calls > 0
        yield sse_event(_chunk(job, [_chunk_choice(output, delta, logprobs, called)]))
    if job.body.include_usage:
        usage = UsageInfo.of(job.num_prompt_tokens, sum(num_output), spec)
        yield sse_event(_chunk(job, [], usage))


def _delta(output: RequestOutput, parser: ToolCallStream | WholeReplyStream | None) -> DeltaMessage:
    if parser is None:
        return DeltaMessage(content=output.new_text)
    first = parser.num_calls
    content, calls = parser.feed(output.new_text)
    if output.finished:
        held, last = parser.finish()
        content, calls = content + held, calls + last
    tool_calls = [_tool_call(call, first + i) for i, call in enumerate(calls)]
    return DeltaMessage(content=content, tool_calls=tool_calls or None)


def _chunk_choice(
    output: RequestOutput, delta: DeltaMessage, logprobs: ChatLogprobs | None, called: bool
) -> ChatChunkChoice:
    finish_reason = output.finish_reason if output.finished else None
    if called and finish_reason == "stop":
        finish_reason = "tool_calls"
    return ChatChunkChoice(
        index=output.index,
        delta=delta,
        logprobs=logprobs,
        finish_reason=finish_reason,
    )


def _chunk(
    job: _ChatJob, choices: list[ChatChunkChoice], usage: UsageInfo | None = None
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=job.request_id, created=job.created, model=job.model, choices=choices, usage=usage
    )
