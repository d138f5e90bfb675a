"""What every route handler shares: settings, model-name checks, the per-request caps,
admission, and the generation routes' pipeline (serve: prepare -> admit -> reply, streamed or
collected; each route says only what differs: GenerationRoute).

Admission ends when the engine first schedules the request (RequestStream.started): only then
does a route answer, so a streamed request's 200 and headers mean "running", not "queued". A
request still queued after `admission_timeout_s`, or when a drain begins, is aborted and gets
503 + Retry-After (it has no headers yet, so the client may retry it elsewhere).

The engine's own input checks (vocabulary, context length) run once, at admission
(AsyncEngine.add_request, on the event loop): their ValueErrors become precise 400s here,
named as the client sent the field (`messages`, `prompt`), without waiting for an engine step.
Tokenizing or rendering long text runs off the event loop, so one large request cannot stall
the others (or /health).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from fastapi import Request
from fastapi.responses import Response
from jinja2 import TemplateError
from pydantic import BaseModel, ValidationError

from engine.front.async_engine import AsyncEngine, EngineDeadError, QueueFullError, RequestStream
from engine.request import check_prompt
from engine.sampling_params import SamplingParams
from server.errors import APIError, bad_request, from_validation_errors, from_value_error
from server.logprobs import TokenTexts
from server.settings import ServerSettings
from server.streaming import SSEResponse, with_error_events
from server.tool_formats import tool_format

_LONG_TEXT_CHARS = 16_384  # text (or token ids) longer than this is tokenized off the loop
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class ServingContext:
    """The engine plus the few facts and helpers route handlers need."""

    def __init__(self, engine: AsyncEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.model_names = settings.served_model_names or (engine.model_name,)
        self.model_name = self.model_names[0]
        self.texts = TokenTexts(engine.tokenizer)
        self.created = int(time.time())
        # The model's tool-call format, read once from its chat template (server/tool_formats.py).
        template_for = getattr(engine.tokenizer, "template_for", None)
        self.tool_format = tool_format(template_for(tools=True) if template_for else None)
        self.drain = asyncio.Event()  # set when a drain begins (GuardMiddleware reads it too)

    @property
    def draining(self) -> bool:
        return self.drain.is_set()

    def start_draining(self) -> None:
        """Refuse new requests and the queued ones (never scheduled); running ones go on."""
        self.drain.set()

    # ---- checks ------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> str:
        if model is not None and model not in self.model_names:
            names = ", ".join(repr(name) for name in self.model_names)
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {names}",
                param="model",
                code="model_not_found",
            )
        return self.model_name

    @property
    def tokenizer(self) -> Any:
        if self.engine.tokenizer is None:
            raise bad_request("this model has no tokenizer: send token ids instead of text")
        return self.engine.tokenizer

    async def encode(self, text: str, param: str = "prompt") -> list[int]:
        if not text:
            raise bad_request(f"{param} must not be empty", param)
        return await self.tokenize(text)

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> list[int]:
        encode = self.tokenizer.encode
        return await _off_loop_if_long(
            len(text), encode, text, add_special_tokens=add_special_tokens
        )

    async def decode(self, token_ids: list[int]) -> str:
        return await _off_loop_if_long(len(token_ids), self.tokenizer.decode, token_ids)

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        size = sum(len(m.get("content") or "") for m in messages)
        tokenizer = self.tokenizer
        extra = {}
        if tools is not None:
            if not getattr(tokenizer, "supports_tools", False):
                raise bad_request(
                    "tools: this model's chat template does not support tools (it never reads "
                    "them), so the model cannot be told about them",
                    "tools",
                )
            extra["tools"] = tools
        try:
            return await _off_loop_if_long(
                size,
                tokenizer.apply_chat_template,
                messages,
                add_generation_prompt=add_generation_prompt,
                **extra,
            )
        except (ValueError, TemplateError) as exc:  # e.g. "roles must alternate"
            raise bad_request(
                f"messages: cannot apply the chat template: {exc}", "messages"
            ) from None

    def check_prompt(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int | None,
        param: str = "prompt",
        max_model_len: int | None = None,
    ) -> None:
        """The engine's prompt check (engine.request.check_prompt) for ids the server itself
        must read before admission (/detokenize: only the ids); errors about the prompt name
        `param`. max_model_len: the engine's unless given."""
        engine = self.engine
        limit = max_model_len if max_model_len is not None else engine.max_model_len
        try:
            check_prompt(prompt_token_ids, max_tokens, engine.vocab_size, limit)
        except ValueError as exc:
            error = from_value_error(exc)
            if error.param == "prompt":  # named as the client sent it (messages, tokens)
                error = bad_request(param + str(exc).removeprefix("prompt"), param)
            raise error from None

    def _check_caps(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> None:
        """The per-request caps (ServerSettings): the server's policy, not the engine's."""
        settings, n = self.settings, params.n
        num_seqs = len(prompts) * n
        # Beyond the in-flight limit a request could never be admitted: a 400, not a 503.
        in_flight = self.engine.max_num_in_flight
        limit = min(settings.max_seqs_per_request, in_flight or settings.max_seqs_per_request)
        if num_seqs > limit:
            raise bad_request(
                f"n: {len(prompts)} prompts x n={n} = {num_seqs} sequences; a request may "
                f"have at most {limit}",
                "n",
            )
        limit = self.engine.max_model_len
        reach = [
            len(p) + (limit - len(p) if params.max_tokens is None else params.max_tokens)
            for p in prompts
        ]
        total = n * sum(reach)
        if total > settings.max_tokens_per_request:
            raise bad_request(
                f"max_tokens: this request may reach {total} tokens (prompt + max_tokens for "
                f"each of {num_seqs} sequences); a request may reach at most "
                f"{settings.max_tokens_per_request}: lower max_tokens, n or the prompts",
                "max_tokens",
            )

    # ---- admission ---------------------------------------------------------------------------
    async def admit(
        self,
        request_id: str,
        prompts: Sequence[list[int]],
        params: SamplingParams,
        guided_field: str = "guided",
        prompt_field: str = "prompt",
        raw: Request | None = None,
    ) -> list[RequestStream]:
        """Admit one engine request per prompt, all or none, within the per-request caps;
        engine refusals become API errors, named by the field the client sent (`prompt_field`
        for the prompt, `guided_field` for a grammar the engine cannot compile). `raw`: the
        HTTP request, watched for its client hanging up while queued."""
        self._check_caps(prompts, params)
        if self.draining:
            raise self.unavailable("the server is shutting down")
        ids = (
            [request_id]
            if len(prompts) == 1
            else [f"{request_id}-p{i}" for i in range(len(prompts))]
        )
        arrival = time.monotonic()
        results = await asyncio.gather(
            *(
                self.engine.add_request(i, p, params, arrival)
                for i, p in zip(ids, prompts, strict=True)
            ),
            return_exceptions=True,
        )
        streams = [r for r in results if isinstance(r, RequestStream)]
        errors = [r for r in results if not isinstance(r, RequestStream)]
        if errors:
            for stream in streams:
                stream.close()
            error = self._admission_error(errors[0])
            fields = {"guided": guided_field, "prompt": prompt_field}
            if isinstance(error, APIError) and error.param in fields:
                field = fields[error.param]
                error = bad_request(field + error.message.removeprefix(error.param), field)
            raise error
        await self._until_scheduled(streams, raw)
        return streams

    async def _until_scheduled(self, streams: Sequence[RequestStream], raw: Request | None) -> None:
        """Wait until the engine schedules every stream; on the admission timeout, a drain or
        the client hanging up meanwhile, abort them and answer 503 (400 to a gone client)."""
        if all(stream.started.is_set() for stream in streams):
            return
        started = asyncio.gather(*(stream.started.wait() for stream in streams))
        drain = asyncio.ensure_future(self.drain.wait())
        timeout = self.settings.admission_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        gone = False
        try:
            while not (started.done() or drain.done() or gone):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                poll = self.settings.disconnect_poll_s
                # FIRST_COMPLETED: asyncio.wait's default waits for both, and a drain rarely
                # comes, so every admission took a whole poll (0.25 s of time to first token).
                await asyncio.wait(
                    [started, drain], timeout=min(poll, left or poll), return_when=FIRST_COMPLETED
                )
                gone = raw is not None and not started.done() and await raw.is_disconnected()
        finally:
            started.cancel()
            drain.cancel()
        if all(stream.started.is_set() for stream in streams):
            return
        for stream in streams:
            stream.close()
        if gone:
            raise APIError(400, "client disconnected")
        if self.draining:
            raise self.unavailable("the server is shutting down")
        raise self.unavailable(
            f"server busy: the request was not scheduled within {timeout:g} s; retry later"
        )

    def _admission_error(self, error: BaseException) -> BaseException:
        if isinstance(error, ValueError):
            return from_value_error(error)
        if isinstance(error, QueueFullError):
            return self.unavailable(str(error))
        if isinstance(error, EngineDeadError):
            return self.unavailable(str(error))
        return error

    def unavailable(self, message: str) -> APIError:
        return APIError(503, message, headers={"Retry-After": str(self.settings.retry_after_s)})


class Prepared(NamedTuple):
    """What a generation route admits: one engine request per prompt, with these params, and
    whatever else its reply needs (`state`: the route's own)."""

    prompts: list[list[int]]
    params: SamplingParams
    state: Any = None


class Admitted(NamedTuple):
    """The request once the engine took it: its id, the model named, one stream per prompt."""

    request_id: str
    model: str
    streams: list[RequestStream]


class Reply(NamedTuple):
    """A route's answer to an admitted request: its SSE events, its whole response (each
    called at most once), and the abort of whatever has not finished."""

    events: Callable[[], AsyncIterator[bytes]]
    collect: Callable[[], Awaitable[BaseModel]]
    close: Callable[[], None]


class GenerationRoute(Protocol):
    """One generation endpoint's part of serve(): what differs between /v1/completions and
    /v1/chat/completions."""

    id_prefix: str  # of the engine request id (new_request_id)
    prompt_field: str  # the body field an engine refusal of a prompt is named by

    async def prepare(self, ctx: ServingContext, body: Any) -> Prepared: ...

    async def reply(
        self, ctx: ServingContext, body: Any, prepared: Prepared, admitted: Admitted
    ) -> Reply: ...


async def serve(ctx: ServingContext, raw: Request, body: Any, route: GenerationRoute) -> Response:
    """Every generation route, in order: the request's id, the body's own rules, the model
    it names, the route's prompts and params, admission (all prompts or none, until the
    engine schedules them), then the route's reply, streamed as SSE or collected whole
    (cancelled if the client hangs up), its requests aborted when the client goes away."""
    request_id = new_request_id(raw, route.id_prefix)
    body.check_api_rules()
    model = ctx.check_model(body.model)
    prepared = await route.prepare(ctx, body)
    streams = await ctx.admit(
        request_id, prepared.prompts, prepared.params, body.guided_field, route.prompt_field, raw
    )
    reply = await route.reply(ctx, body, prepared, Admitted(request_id, model, streams))
    if body.stream:
        return SSEResponse(with_error_events(reply.events(), raw.scope), on_close=reply.close)
    try:
        result = await until_disconnected(raw, reply.collect(), ctx.settings.disconnect_poll_s)
    finally:
        reply.close()
    return Response(result.model_dump_json(), media_type="application/json")


def new_request_id(raw: Request, prefix: str) -> str:
    """The engine's id of this request: unique even when clients reuse an X-Request-Id. The
    failure log line names the X-Request-Id (RequestIdMiddleware), and names this id too."""
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    client_id = getattr(raw.state, "request_id", None)
    raw.state.request_id = request_id if client_id is None else f"{client_id} ({request_id})"
    return request_id


async def _off_loop_if_long(size: int, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    if size < _LONG_TEXT_CHARS:
        return work(*args, **kwargs)
    # Megabytes of text take a while to tokenize: keep the event loop serving meanwhile.
    return await asyncio.to_thread(work, *args, **kwargs)


async def parse_body(request: Request, model: type[M]) -> M:
    """The request body validated as `model`: a JSON content type (or none) is required (415),
    malformed JSON and wrong types are 400s."""
    content_type = request.headers.get("content-type")
    if content_type is not None and not _is_json(content_type):
        raise APIError(415, f"Content-Type must be application/json, got {content_type[:100]!r}")
    raw = await request.body()
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise from_validation_errors(list(exc.errors())) from None


async def until_disconnected(request: Request, work: Awaitable[T], poll: float) -> T:
    """Await `work`, cancelling it if the client hangs up (its cleanup aborts the requests)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise APIError(400, "client disconnected")
    finally:
        if not task.done():
            task.cancel()


def _is_json(content_type: str) -> bool:
    media_type = content_type.split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")
