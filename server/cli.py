"""`goodspeed serve` (and `python -m server`): parse flags, load the model, run uvicorn.

SIGTERM drains: new requests get 503 (and /health turns 503) while in-flight requests finish,
for at most --drain-timeout seconds; what is still running then is aborted, and the process
exits 0. A second SIGTERM, or Ctrl-C, stops at once (uvicorn's usual behaviour;
server/draining.py).

Start-up order (docs/benchmarks.md "Start-up time"): the flags need nothing of the web stack
(ServerSettings lives in server/settings.py), so the model starts loading before fastapi,
pydantic and uvicorn are imported; they are imported, and then the tokenizer read, on this
thread while the load runs on its own (load_engine). The cyclic garbage collector pauses
meanwhile (collection_paused_then_frozen).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from concurrent.futures import Future
from typing import TYPE_CHECKING

from engine.arg_utils import add_engine_arguments, config_from_args
from engine.config import EngineConfig, parse_size
from engine.front.heap import collection_paused_then_frozen
from server.settings import ServerSettings

if TYPE_CHECKING:
    from engine.front.async_engine import AsyncEngine

logger = logging.getLogger("goodspeed.server")


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    group.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    group.add_argument(
        "--served-model-name",
        nargs="+",
        default=[],
        help="model names clients may use; the first is reported in responses (default: the "
        "model's file or directory name)",
    )
    group.add_argument(
        "--allowed-origins",
        nargs="+",
        default=[],
        help="browser origins allowed by CORS, e.g. https://app.example or '*' (default: CORS off)",
    )
    group.add_argument(
        "--api-key",
        default=os.environ.get("GOODSPEED_API_KEY"),
        help="require 'Authorization: Bearer KEY' on the API (default: $GOODSPEED_API_KEY)",
    )
    group.add_argument(
        "--max-queue",
        type=_queue_size,
        default=None,
        help="sequences allowed to wait beyond --max-num-seqs; more get 503 + Retry-After "
        "(default: as many as --max-num-seqs; 'unlimited': no bound)",
    )
    group.add_argument(
        "--admission-timeout",
        type=float,
        default=ServerSettings.admission_timeout_s,
        help="seconds a request may wait in the queue before it is scheduled; then 503 + "
        "Retry-After (default %(default)s; 0: wait forever)",
    )
    group.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish after SIGTERM (default 30)",
    )
    group.add_argument(
        "--max-body-size",
        default="4MiB",
        help="largest request body accepted; a larger declared Content-Length gets 413 before "
        "the body is read (default 4MiB)",
    )
    group.add_argument(
        "--header-timeout",
        type=float,
        default=ServerSettings.header_timeout_s,
        help="seconds a client has to send a request's headers; then the connection is closed "
        "(default %(default)s)",
    )
    group.add_argument(
        "--body-timeout",
        type=float,
        default=ServerSettings.body_timeout_s,
        help="seconds a client has to send a request's whole body; then 408 (default %(default)s)",
    )
    group.add_argument(
        "--max-seqs-per-request",
        type=int,
        default=ServerSettings.max_seqs_per_request,
        help="prompts x n allowed in one request; more get 400 (default %(default)s)",
    )
    group.add_argument(
        "--max-tokens-per-request",
        type=int,
        default=ServerSettings.max_tokens_per_request,
        help="tokens one request may reach: (prompt + max_tokens) summed over its prompts x n; "
        "more get 400 (default %(default)s)",
    )
    group.add_argument(
        "--log-level",
        default="info",
        help="debug | info | warning | error (failed requests: one line each; tracebacks at debug)",
    )
    add_engine_arguments(parser)


def run_serve(args: argparse.Namespace) -> int:
    """Build the engine from the flags and serve until SIGTERM; returns the exit code."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        logging.getLogger().setLevel(args.log_level.upper())  # also when basicConfig ran before
        config = config_from_args(args)
        settings = ServerSettings(
            served_model_names=tuple(args.served_model_name),
            allowed_origins=tuple(args.allowed_origins),
            api_key=args.api_key or None,
            max_body_bytes=parse_size(args.max_body_size),
            max_seqs_per_request=args.max_seqs_per_request,
            max_tokens_per_request=args.max_tokens_per_request,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            admission_timeout_s=args.admission_timeout or None,
        )
    except (ValueError, OSError) as exc:
        print(f"goodspeed serve: {exc}", file=sys.stderr)
        return 2
    limit = in_flight_limit(config.scheduler.max_num_seqs, args.max_queue)
    logger.info("loading %s", config.model.model)
    with collection_paused_then_frozen():
        engine = load_engine(config, max_num_in_flight=limit)
    return serve(engine, settings, args.host, args.port, args.drain_timeout, args.log_level)


def load_engine(config: EngineConfig, **kwargs) -> AsyncEngine:
    """The engine for `config`: the model loads on its own thread while this one imports the
    web stack (fastapi, pydantic, uvicorn: ~0.4 s of Python) and then reads the tokenizer
    (a Rust parse that holds the GIL, ~0.3 s for 152k tokens), which it hands to the load.
    The imports share the GIL with the load's short Python steps (the GGUF header, the decoder
    built); its long steps (the tiles packed, the KV cache zero-filled) run native code on both
    cores (docs/benchmarks.md "Start-up time" measures where the time goes)."""
    from engine.front.async_engine import AsyncEngine
    from engine.models.loader import resolve_model_path
    from engine.models.tokenizer import Tokenizer

    tokenizer: Future = Future()
    loading = AsyncEngine.start_loading(config, tokenizer=tokenizer, **kwargs)
    try:
        import server.app  # noqa: F401 - fastapi, pydantic and the routes
        import server.draining  # noqa: F401 - uvicorn

        tokenizer.set_result(Tokenizer.from_path(resolve_model_path(config.model.model)))
    except BaseException as exc:  # noqa: BLE001 - the load waits for the tokenizer: end it
        tokenizer.set_exception(exc)
        raise
    return loading.result()


def _queue_size(text: str) -> int:
    """--max-queue: a count >= 0, or 'unlimited' (-1)."""
    if text == "unlimited":
        return -1
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 or 'unlimited', got {text}")
    return value


def in_flight_limit(max_num_seqs: int, max_queue: int | None) -> int | None:
    """Sequences admitted at once: the batch plus the queue (None: unbounded). The default
    queue is one batch deep: a queued request waits about one generation for its turn."""
    if max_queue == -1:
        return None
    return max_num_seqs + (max_num_seqs if max_queue is None else max_queue)


def serve(
    engine: AsyncEngine,
    settings: ServerSettings,
    host: str = "127.0.0.1",
    port: int = 8000,
    drain_timeout: float = 30.0,
    log_level: str = "info",
) -> int:
    """Serve `engine` over HTTP until SIGTERM (drain) or Ctrl-C."""
    from server.app import build_app
    from server.draining import DrainingServer
    from server.http_limits import uvicorn_config

    app = build_app(engine, settings)
    config = uvicorn_config(
        app,
        host,
        port,
        settings.header_timeout_s,
        log_level=log_level.lower(),
        timeout_graceful_shutdown=5,
    )
    server = DrainingServer(config, app.state.ctx, drain_timeout)
    server.run()
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m server", description="OpenAI-compatible goodspeed server"
    )
    add_serve_arguments(parser)
    return run_serve(parser.parse_args(argv))
