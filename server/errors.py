"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` for every failure.

Client mistakes are 4xx with a message naming the field and what is allowed; FastAPI's 422
validation responses become 400; a 500 only ever means a bug or a failed generation.

Every failed request is logged once, in one line (request id, method and path, status, error
class, message): client errors at INFO, server errors at ERROR, a traceback only at DEBUG.
Exceptions no handler here knows are answered by server/middleware.py's UnhandledErrorMiddleware.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from engine.front.async_engine import EngineDeadError

logger = logging.getLogger(__name__)

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    500: "server_error",
    503: "service_unavailable_error",
}

# Fields accepting several JSON shapes: a union mismatch reports what is allowed instead of
# the first alternative's complaint.
_UNION_HINTS = {
    "prompt": "a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "a string or a list of strings",
    "content": "a string or a list of text parts",
    "tokens": "a list of token ids",
}
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|dict|list|[A-Z]\w*)$|[\[\-]")


class APIError(Exception):
    def __init__(
        self,
        status_code: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.status_code, self.message, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


def error_body(
    status_code: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    error_type = ERROR_TYPES.get(status_code, "invalid_request_error")
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def error_bytes(status_code: int, message: str, code: str | None = None) -> bytes:
    return json.dumps(error_body(status_code, message, code=code)).encode()


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def from_value_error(exc: ValueError) -> APIError:
    """SamplingParams / engine ValueErrors start with the field name (`n must be ...`)."""
    message = str(exc)
    match = re.match(r"([a-z_]+)\b", message)
    return APIError(400, message, param=match.group(1) if match else None)


def from_validation_errors(errors: list[dict[str, Any]]) -> APIError:
    """One 400 from pydantic's error list: the most specific error, named by its field path."""
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    if first["type"] == "json_invalid":
        return bad_request(f"request body is not valid JSON: {first['msg']}")
    if first["type"] == "model_type" and not _field_path(first["loc"]):
        return bad_request("request body must be a JSON object")
    unknown = [e for e in errors if e["type"] == "extra_forbidden" and not _union_path(e["loc"])]
    if unknown:  # a field we do not know: never ignored silently (docs/api.md)
        param = ".".join(str(p) for p in _field_path(unknown[0]["loc"]))
        return bad_request(
            f"{param}: unknown or unsupported field (docs/api.md lists the fields this server "
            "honours)",
            param,
        )
    union_path = _union_path(errors[0]["loc"])
    hint = _UNION_HINTS.get(str(union_path[-1])) if union_path else None
    if hint:  # the value matched none of the field's accepted shapes
        param = ".".join(str(p) for p in union_path)
        return bad_request(f"{param} must be {hint}", param)
    best = max(errors, key=lambda e: len(_field_path(e["loc"])))
    path = _field_path(best["loc"])
    param = ".".join(str(p) for p in path) or None
    if best["type"] == "missing":
        return bad_request(f"{param} is required", param)
    return bad_request(f"{param}: {best['msg']}", param)


def _union_path(loc: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """The field path up to the first union-member tag, or None if the location has none."""
    body = loc[1:] if loc and loc[0] == "body" else loc
    for position, part in enumerate(body):
        if isinstance(part, str) and _TYPE_TAG.search(part):
            return tuple(body[:position])
    return None


def _field_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """Drop pydantic's union-member tags ('str', 'list[int]', 'TextPart') from a location."""
    body = loc[1:] if loc and loc[0] == "body" else loc
    return tuple(p for p in body if isinstance(p, int) or not _TYPE_TAG.search(p))


def log_failure(scope: Scope, status: int, error_class: str, message: str) -> None:
    """The one log line of a failed request; its id is set by the handler once it has one."""
    request_id = scope.get("state", {}).get("request_id", "-")
    logger.log(
        logging.ERROR if status >= 500 else logging.INFO,
        "request %s (%s %s) failed: %d %s: %s",
        request_id,
        scope.get("method", "-"),
        scope.get("path", "-"),
        status,
        error_class,
        message,
    )


def _logged(request: Request, error: APIError) -> JSONResponse:
    log_failure(
        request.scope, error.status_code, ERROR_TYPES.get(error.status_code, "error"), error.message
    )
    return error.response()


async def _api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return _logged(request, exc)


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError | ValidationError)
    return _logged(request, from_validation_errors(list(exc.errors())))


async def _http_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else str(exc.status_code)
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}"
    return _logged(request, APIError(exc.status_code, message, headers=exc.headers))


async def _engine_dead_handler(request: Request, exc: Exception) -> JSONResponse:
    return _logged(request, APIError(503, str(exc)))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(APIError, _api_error_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(ValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_handler)
    app.add_exception_handler(EngineDeadError, _engine_dead_handler)
