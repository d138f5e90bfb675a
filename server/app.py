"""The FastAPI application: routes, middleware, error handlers and the engine's lifetime.

`build_app(engine, settings)` wires one AsyncEngine into a fresh app; the engine thread starts
with the app (lifespan) and stops with it. Several apps can live in one process (tests): each
has its own Prometheus registry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response

from engine.front.async_engine import AsyncEngine
from server.errors import APIError, bad_request, install_error_handlers
from server.metrics import EngineMetrics
from server.middleware import GuardMiddleware, RequestIdMiddleware, UnhandledErrorMiddleware
from server.openapi import json_body
from server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from server.protocol_messages import check_messages
from server.responses import ModelCard, ModelList
from server.serving import ServingContext, parse_body, serve
from server.serving_chat import CHAT
from server.serving_completions import COMPLETIONS
from server.settings import ServerSettings


def _version() -> str:
    try:
        return metadata.version("goodspeed")
    except metadata.PackageNotFoundError:  # running from a source checkout
        return "unknown"


def build_app(engine: AsyncEngine, settings: ServerSettings | None = None) -> FastAPI:
    settings = settings or ServerSettings()
    ctx = ServingContext(engine, settings)
    proposers = [entry[0] for entry in engine.stats().spec_proposer_totals]
    metrics = EngineMetrics(ctx.model_name, proposers=proposers)
    engine.stat_loggers.append(metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        engine.abort_all("the server is shutting down")
        await asyncio.to_thread(engine.shutdown)

    app = FastAPI(
        title="goodspeed",
        version=_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.ctx = ctx
    app.state.metrics = metrics
    install_error_handlers(app)
    app.add_middleware(
        GuardMiddleware,
        max_body_bytes=settings.max_body_bytes,
        api_key=settings.api_key,
        is_draining=ctx.drain.is_set,
        retry_after_s=settings.retry_after_s,
        body_timeout_s=settings.body_timeout_s,
    )
    if settings.allowed_origins:  # outside the guard: a CORS preflight carries no API key
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(settings.allowed_origins),
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=["X-Request-Id"],
        )
    app.add_middleware(UnhandledErrorMiddleware)  # outside the rest, so it sees every bug
    app.add_middleware(RequestIdMiddleware)  # outermost: every response carries the id
    _add_info_routes(app, ctx, metrics)
    _add_generation_routes(app, ctx)
    return app


def _add_info_routes(app: FastAPI, ctx: ServingContext, metrics: EngineMetrics) -> None:
    @app.get("/health")
    async def health() -> Response:
        if ctx.draining:
            return ctx.unavailable("the server is shutting down").response()
        if not ctx.engine.is_healthy:
            return APIError(503, ctx.engine.dead_error or "the engine is not running").response()
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": app.version}

    @app.get("/metrics")
    async def prometheus() -> Response:
        content, content_type = metrics.render()
        return Response(content, media_type=content_type)

    def card(name: str) -> ModelCard:
        return ModelCard(
            id=name,
            created=ctx.created,
            root=ctx.engine.model_name,
            max_model_len=ctx.engine.max_model_len,
        )

    @app.get("/v1/models")
    async def list_models() -> Response:
        cards = [card(name) for name in ctx.model_names]
        return Response(ModelList(data=cards).model_dump_json(), media_type="application/json")

    @app.get("/v1/models/{model_id:path}")
    async def retrieve_model(model_id: str) -> Response:
        ctx.check_model(model_id)
        return Response(card(model_id).model_dump_json(), media_type="application/json")


def _add_generation_routes(app: FastAPI, ctx: ServingContext) -> None:
    @app.post("/v1/completions", openapi_extra=json_body(CompletionRequest))
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        return await serve(ctx, request, body, COMPLETIONS)

    @app.post("/v1/chat/completions", openapi_extra=json_body(ChatCompletionRequest))
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        return await serve(ctx, request, body, CHAT)

    @app.post("/tokenize", openapi_extra=json_body(TokenizeRequest))
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await parse_body(request, TokenizeRequest)
        ctx.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise bad_request("send exactly one of prompt and messages", "prompt")
        if body.messages is not None:
            check_messages(body.messages)
            messages = [m.as_template_dict() for m in body.messages]
            add_generation_prompt = body.add_generation_prompt is not False
            tokens = await ctx.apply_chat_template(messages, add_generation_prompt)
        else:
            add_special_tokens = body.add_special_tokens is not False
            tokens = await ctx.tokenize(body.prompt or "", add_special_tokens)
        return {"tokens": tokens, "count": len(tokens), "max_model_len": ctx.engine.max_model_len}

    @app.post("/detokenize", openapi_extra=json_body(DetokenizeRequest))
    async def detokenize(request: Request) -> dict[str, str]:
        body = await parse_body(request, DetokenizeRequest)
        ctx.check_model(body.model)
        if body.tokens:
            ctx.check_prompt(body.tokens, None, "tokens", max_model_len=len(body.tokens) + 1)
        return {"prompt": await ctx.decode(body.tokens)}
