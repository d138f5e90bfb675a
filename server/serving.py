"""What every route handler shares: settings, model-name checks, prompt checks, admission.

Prompt checks (vocabulary, context length) run here, before the engine thread sees the request,
so that the common mistakes get precise 400s without waiting for an engine step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from engine.async_engine import AsyncEngine, EngineDeadError, QueueFullError, RequestStream
from engine.request import check_prompt
from engine.sampling_params import SamplingParams
from server.errors import APIError, bad_request, from_validation_errors, from_value_error
from server.logprobs import TokenTexts

_LONG_TEXT_CHARS = 16_384
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class ServerSettings:
    served_model_name: str | None = None  # None: the engine's model name
    api_key: str | None = None  # None: no authentication
    max_body_bytes: int = 4 * 2**20  # larger request bodies get 413
    retry_after_s: int = 1  # Retry-After of 503 answers
    disconnect_poll_s: float = 0.25  # how often a non-streaming request checks for its client


class ServingContext:
    """The engine plus the few facts and helpers route handlers need."""

    def __init__(self, engine: AsyncEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.model_name = settings.served_model_name or engine.model_name
        self.texts = TokenTexts(engine.tokenizer)
        self.created = int(time.time())
        self.draining = False

    # ---- checks ------------------------------------------------------------------------------
    def check_model(self, model: str | None) -> str:
        if model is not None and model != self.model_name:
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.model_name!r}",
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
        if len(text) < _LONG_TEXT_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=True)
        # Megabytes of text take a while to tokenize: keep the event loop serving meanwhile.
        return await asyncio.to_thread(self.tokenizer.encode, text, add_special_tokens=True)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool
    ) -> list[int]:
        try:
            return self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt
            )
        except ValueError as exc:
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
        """The engine's own prompt check (engine.request.check_prompt), before admission, so a
        multi-prompt request is refused whole; errors about the prompt name `param`.
        max_model_len: the engine's unless given (/detokenize checks only the ids)."""
        engine = self.engine
        limit = max_model_len if max_model_len is not None else engine.max_model_len
        try:
            check_prompt(prompt_token_ids, max_tokens, engine.vocab_size, limit)
        except ValueError as exc:
            error = from_value_error(exc)
            if error.param == "prompt":  # named as the client sent it (messages, tokens)
                error = bad_request(param + str(exc).removeprefix("prompt"), param)
            raise error from None

    # ---- admission ---------------------------------------------------------------------------
    async def admit(
        self, request_id: str, prompts: Sequence[list[int]], params: SamplingParams
    ) -> list[RequestStream]:
        """Admit one engine request per prompt, all or none; engine refusals become API errors."""
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
            raise self._admission_error(errors[0])
        return streams

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


async def parse_body(request: Request, model: type[M]) -> M:
    """The request body validated as `model`; malformed JSON and wrong types are 400s."""
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
