"""POST /v1/completions: prompts (text or token ids, one or a batch) -> text completions.

Choice index = prompt position * n + choice of that prompt. `echo` prepends the prompt text
(and, with `logprobs`, the prompt tokens' logprobs, the first of them null). Usage counts each
prompt once and every choice's output tokens.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import partial

from engine.front.async_engine import RequestStream
from engine.outputs import RequestOutput, TokenLogprobs
from engine.request import SpecCounts
from server.logprobs import completion_logprobs, generated_positions, prompt_positions
from server.protocol import CompletionRequest
from server.responses import CompletionChoice, CompletionResponse, UsageInfo
from server.serving import Admitted, Prepared, Reply, ServingContext
from server.streaming import (
    ChunkTemplate,
    merge_streams,
    raise_if_failed,
    sse_event,
)


@dataclass
class _Prompt:
    token_ids: list[int]
    text: str | None  # None: sent as token ids, decoded once admitted


@dataclass
class _Job:
    """One validated completion request, admitted to the engine."""

    request_id: str
    model: str
    body: CompletionRequest
    prompts: list[_Prompt]
    streams: list[RequestStream]
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def n(self) -> int:
        return self.body.n or 1

    def close(self) -> None:
        for stream in self.streams:
            stream.close()


class CompletionRoute:
    """POST /v1/completions in serving.serve: prompts (text or token ids, one or a batch), one
    engine request each; prompts sent as ids are decoded once admitted (for `echo`)."""

    id_prefix = "cmpl"
    prompt_field = "prompt"

    async def prepare(self, ctx: ServingContext, body: CompletionRequest) -> Prepared:
        params = body.sampling_params(ctx.engine.vocab_size)
        prompts = [await _to_prompt(ctx, p) for p in body.prompt_list()]
        return Prepared([p.token_ids for p in prompts], params, prompts)

    async def reply(
        self, ctx: ServingContext, body: CompletionRequest, prepared: Prepared, admitted: Admitted
    ) -> Reply:
        job = _Job(admitted.request_id, admitted.model, body, prepared.state, admitted.streams)
        try:
            await _decode_token_prompts(ctx, job.prompts)
        except BaseException:
            job.close()
            raise
        return Reply(partial(_stream, ctx, job), partial(_collect, ctx, job), job.close)


COMPLETIONS = CompletionRoute()


async def _to_prompt(ctx: ServingContext, prompt: str | list[int]) -> _Prompt:
    if isinstance(prompt, str):
        return _Prompt(await ctx.encode(prompt), prompt)
    return _Prompt(list(prompt), None)


async def _decode_token_prompts(ctx: ServingContext, prompts: list[_Prompt]) -> None:
    """The text of prompts sent as token ids (for `echo`), once admission checked the ids."""
    for prompt in prompts:
        if prompt.text is None:
            has_tokenizer = ctx.engine.tokenizer is not None
            prompt.text = await ctx.decode(prompt.token_ids) if has_tokenizer else ""


@dataclass
class _Choice:
    text: str = ""
    logprobs: list[TokenLogprobs] = field(default_factory=list)
    prompt_logprobs: list[TokenLogprobs | None] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    spec: SpecCounts | None = None

    def add(self, output: RequestOutput) -> None:
        self.spec = output.spec
        self.text += output.new_text
        self.logprobs.extend(output.logprobs or ())
        if output.prompt_logprobs:
            self.prompt_logprobs = list(output.prompt_logprobs)
        self.num_output_tokens = output.num_output_tokens
        if output.finished:
            self.finish_reason = output.finish_reason


async def _collect(ctx: ServingContext, job: _Job) -> CompletionResponse:
    choices = [_Choice() for _ in range(len(job.prompts) * job.n)]
    async for position, output in merge_streams(job.streams):
        raise_if_failed(output, job.body.guided_field)
        choices[position * job.n + output.index].add(output)
    response_choices = []
    for index, choice in enumerate(choices):
        prompt = job.prompts[index // job.n]
        echo = bool(job.body.echo)
        logprobs = None
        if job.body.logprobs is not None:
            positions = _positions(prompt, choice.prompt_logprobs, choice.logprobs, echo)
            logprobs, _ = completion_logprobs(positions, ctx.texts, 0)
        text = prompt.text + choice.text if echo else choice.text
        response_choices.append(
            CompletionChoice(
                index=index, text=text, logprobs=logprobs, finish_reason=choice.finish_reason
            )
        )
    num_completion = sum(c.num_output_tokens for c in choices)
    return CompletionResponse(
        id=job.request_id,
        created=job.created,
        model=job.model,
        choices=response_choices,
        usage=UsageInfo.of(
            sum(len(p.token_ids) for p in job.prompts), num_completion, [c.spec for c in choices]
        ),
    )


async def _stream(ctx: ServingContext, job: _Job) -> AsyncIterator[bytes]:
    offsets: dict[int, int] = {}  # choice index -> text offset reached (logprobs text_offset)
    num_output: dict[int, int] = {}
    spec: dict[int, SpecCounts | None] = {}
    template = ChunkTemplate(_chunk(job, []))
    async for position, output in merge_streams(job.streams):
        raise_if_failed(output, job.body.guided_field)
        index = position * job.n + output.index
        spec[index] = output.spec
        prompt = job.prompts[position]
        echo = bool(job.body.echo) and index not in offsets  # the prompt goes in the first chunk
        text = prompt.text + output.new_text if echo else output.new_text
        logprobs, offset = None, offsets.get(index, 0)
        if job.body.logprobs is not None:
            positions = _positions(prompt, output.prompt_logprobs, output.logprobs, echo)
            logprobs, offset = completion_logprobs(positions, ctx.texts, offset)
        offsets[index] = offset
        num_output[index] = output.num_output_tokens
        if not (text or output.finished or (logprobs and logprobs.tokens)):
            continue
        finish_reason = output.finish_reason if output.finished else None
        if logprobs is None:  # the common chunk: pre-encoded
            yield template.completion(index, text, finish_reason)
            continue
        choice = CompletionChoice(
            index=index, text=text, logprobs=logprobs, finish_reason=finish_reason
        )
        yield sse_event(_chunk(job, [choice]))
    if job.body.include_usage:
        num_prompt = sum(len(p.token_ids) for p in job.prompts)
        usage = UsageInfo.of(num_prompt, sum(num_output.values()), spec.values())
        yield sse_event(_chunk(job, [], usage))


def _positions(
    prompt: _Prompt,
    prompt_logprobs: list[TokenLogprobs | None] | None,
    logprobs: list[TokenLogprobs] | None,
    echo: bool,
) -> list[tuple[int, TokenLogprobs | None]]:
    """(token id, logprobs) of the tokens a choice reports: echoed prompt, then generated."""
    positions = prompt_positions(prompt.token_ids, prompt_logprobs or []) if echo else []
    return positions + generated_positions(logprobs or [])


def _chunk(
    job: _Job, choices: list[CompletionChoice], usage: UsageInfo | None = None
) -> CompletionResponse:
    return CompletionResponse(
        id=job.request_id, created=job.created, model=job.model, choices=choices, usage=usage
    )
