"""Request-body schemas for the app's OpenAPI document.

Routes read their bodies through parse_body (strict validation, OpenAI-shaped 400s), so FastAPI
cannot see the models; json_body() states them in each route's `openapi_extra`. The schema is
self-contained (pydantic's $defs inlined), so `app.openapi()` describes every body exactly and
the API fuzzer (tests/server/test_api_fuzz.py) can generate requests from it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

_DEFS = "#/$defs/"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body is `model`."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inline(schema, defs)}},
        }
    }


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    """`node` with every {"$ref": "#/$defs/Name"} replaced by that definition (no cycles)."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS):
        return _inline(defs[ref[len(_DEFS) :]], defs)
    return {key: _inline(value, defs) for key, value in node.items()}
